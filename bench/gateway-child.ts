import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** What the gateway child (bench/rollout-gateway.ts) answers to a `sample` request. */
export interface GatewaySample {
  sessions: number;
  cpuSeconds: number;
  loopDelayP99Ms: number;
  joinsThrottled: number;
  refused: number;
  rssMiB: number;
}

/**
 * The gateway in a process of its own (bench/rollout-gateway.ts, given the database, its
 * environment and its options), as the fleet benchmarks run it: `listening` resolves with its
 * address and CA once it listens, `sample` asks for its sessions, CPU and event-loop delay, and
 * every command it completes is passed to `onCompleted` with its wall-time stamp.
 */
export function forkGateway(input: {
  databaseUrl: string;
  env: Record<string, string>;
  options: Record<string, unknown>;
  /** Write a CPU profile of the gateway into this folder. */
  profileDir?: string | undefined;
  onCompleted: (commandId: string, atMs: number) => void;
}): {
  child: ChildProcess;
  listening: Promise<{ address: string; caCertificatePem: string }>;
  sample: () => Promise<GatewaySample>;
} {
  const child = fork(
    fileURLToPath(new URL('./rollout-gateway.ts', import.meta.url)),
    [JSON.stringify({ databaseUrl: input.databaseUrl, env: input.env, options: input.options })],
    {
      execArgv: [
        '--import',
        'tsx',
        ...(input.profileDir ? ['--cpu-prof', `--cpu-prof-dir=${input.profileDir}`] : []),
      ],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    },
  );
  let sampled: ((sample: GatewaySample) => void) | null = null;
  const listening = new Promise<{ address: string; caCertificatePem: string }>((resolve) => {
    child.on(
      'message',
      (m: {
        completed?: string;
        atMs?: number;
        sample?: GatewaySample;
        address?: string;
        caCertificatePem?: string;
      }) => {
        if (m.completed) input.onCompleted(m.completed, m.atMs!);
        else if (m.sample) sampled?.(m.sample);
        else if (m.address) resolve({ address: m.address, caCertificatePem: m.caCertificatePem! });
      },
    );
  });
  const sample = () =>
    new Promise<GatewaySample>((resolve) => {
      sampled = resolve;
      child.send({ type: 'sample' });
    });
  return { child, listening, sample };
}
