import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { type ChildExit, childExited } from '../../db/local-postgres.ts';
import type { Watchdog } from '../../server/supervise.ts';
import type { PlaneChildOptions } from './plane-child.ts';

/** What a part of the control plane said once it served (`ready <json>`). */
export interface PlaneChildInfo {
  url?: string;
  port?: number;
  address?: string;
  caCertificatePem?: string;
}

const program = fileURLToPath(new URL('./plane-child.ts', import.meta.url));

/**
 * One part of the control plane (tests/support/plane-child.ts) in a process of its own that a
 * test can SIGKILL and start again, on the same port once it had one. It runs in a process group
 * of its own registered with `watchdog`, so it never outlives the test process; what it prints on
 * stderr is kept (the last lines) for a failure's message.
 */
export class PlaneChild {
  private child: ChildProcess | null = null;
  private exit: Promise<ChildExit> | null = null;
  private stderr: string[] = [];
  info: PlaneChildInfo = {};
  /** How many times it was started. */
  starts = 0;

  constructor(
    readonly options: PlaneChildOptions,
    private readonly watchdog: Watchdog,
  ) {}

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Starts it (again, on the port it had) and resolves with what it printed once ready. */
  async start(): Promise<PlaneChildInfo> {
    const options = { ...this.options, ...(this.info.port ? { port: this.info.port } : {}) };
    const child = spawn(process.execPath, ['--import', 'tsx', program, JSON.stringify(options)], {
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    this.child = child;
    this.exit = childExited(child);
    this.starts++;
    if (child.pid !== undefined) this.watchdog.watch(child.pid, 'SIGKILL');
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr.push(...chunk.split('\n').filter(Boolean));
      if (this.stderr.length > 40) this.stderr.splice(0, this.stderr.length - 40);
    });
    this.info = await new Promise<PlaneChildInfo>((resolve, reject) => {
      let out = '';
      void this.exit!.then((exit) =>
        reject(
          new Error(
            `the ${this.options.role} child exited (${exit.signal ?? exit.code}) before it was ready:\n${this.stderrTail()}`,
          ),
        ),
      );
      child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        out += chunk;
        const line = out.split('\n').find((l) => l.startsWith('ready '));
        if (line) resolve(JSON.parse(line.slice('ready '.length)) as PlaneChildInfo);
      });
    });
    return this.info;
  }

  /** SIGKILLs it (and anything it forked) and waits until it is gone. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child || child.pid === undefined) return;
    if (child.exitCode === null && child.signalCode === null) {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    }
    await this.exit;
    this.watchdog.unwatch(child.pid);
  }

  stderrTail(): string {
    return this.stderr.slice(-20).join('\n');
  }
}
