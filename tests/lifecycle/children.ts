import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { fastTimers, type LifecycleHarness } from './harness.ts';

/** Starts a worker in a child process on the harness's task queue; resolves once it polls. */
export async function spawnChildWorker(
  h: LifecycleHarness,
  options: { activityTimeoutMs?: number } = {},
): Promise<ChildProcess> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      fileURLToPath(new URL('./worker-child.ts', import.meta.url)),
      JSON.stringify({
        databaseUrl: h.t.url,
        address: h.address,
        taskQueue: h.taskQueue,
        timers: fastTimers,
        ...options,
      }),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the child worker exited with ${code}`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('ready')) resolve();
    });
  });
  return child;
}

/** SIGKILLs a child and waits for it to be gone. */
export async function killChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}
