import { type ChildProcess, spawn } from 'node:child_process';
import type { Logger } from '../core/logger.ts';
import type { ChildExit } from '../db/local-postgres.ts';

/**
 * The watchdog's program (run with `node -e`). It reads `watch <pid> <signal>` and
 * `unwatch <pid>` lines on stdin. When stdin ends (the process that started it exited, whatever
 * killed it, SIGKILL included: the kernel closes the pipe), it sends each watched process group
 * its signal, waits up to 15 s for them to go, SIGKILLs what is left, and exits. It ignores
 * SIGINT, SIGTERM and SIGHUP, so only its parent's end (or SIGKILL) ends it.
 */
const watchdogProgram = `
const groups = new Map();
let buffer = '';
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => {});
const alive = (pid) => { try { process.kill(-pid, 0); return true; } catch { return false; } };
const send = (pid, signal) => { try { process.kill(-pid, signal); } catch {} };
let ending = false;
function end() {
  if (ending) return;
  ending = true;
  for (const [pid, signal] of groups) send(pid, signal);
  const deadline = Date.now() + 15000;
  const poll = setInterval(() => {
    const left = [...groups.keys()].filter(alive);
    if (left.length === 0 || Date.now() > deadline) {
      for (const pid of left) send(pid, 'SIGKILL');
      clearInterval(poll);
      process.exit(0);
    }
  }, 100);
}
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buffer += chunk;
  let newline;
  while ((newline = buffer.indexOf('\\n')) >= 0) {
    const [command, pid, signal] = buffer.slice(0, newline).split(' ');
    buffer = buffer.slice(newline + 1);
    if (command === 'watch') groups.set(Number(pid), signal || 'SIGTERM');
    if (command === 'unwatch') groups.delete(Number(pid));
  }
});
process.stdin.on('end', end);
process.stdin.on('error', end);
`;

/**
 * Makes sure the servers the dev stack started never outlive it. PostgreSQL and the Temporal CLI
 * cannot watch their parent themselves (there is no portable parent-death signal for a child of
 * Node), so a tiny watchdog process in a process group of its own holds a pipe from this process:
 * when this process ends in any way, SIGKILL included, the pipe closes and the watchdog stops every
 * process group still registered with it (each with its own graceful signal, then SIGKILL).
 * On an orderly stop the servers are stopped first and unregistered, and the watchdog has nothing
 * left to do.
 */
export interface Watchdog {
  /** Registers the process group led by `pid`, to be sent `signal` should this process end. */
  watch(pid: number, signal: NodeJS.Signals): void;
  unwatch(pid: number): void;
  /** Ends the watchdog (after the servers were stopped and unregistered). */
  stop(): Promise<void>;
}

export function startWatchdog(): Watchdog {
  const child: ChildProcess = spawn(process.execPath, ['-e', watchdogProgram], {
    stdio: ['pipe', 'ignore', 'ignore'],
    detached: true,
  });
  child.unref();
  const stdin = child.stdin!;
  // The pipe is what the watchdog watches; it must not keep this process alive by itself.
  (stdin as unknown as { unref?: () => void }).unref?.();
  stdin.on('error', () => {});
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const send = (line: string) => {
    if (!stdin.destroyed) stdin.write(`${line}\n`);
  };
  return {
    watch: (pid, signal) => send(`watch ${pid} ${signal}`),
    unwatch: (pid) => send(`unwatch ${pid}`),
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      // Waiting for it must keep this process alive (it was unreferenced so far).
      child.ref();
      stdin.end();
      await exited;
    },
  };
}

/** A server process the dev stack started and keeps running. */
export interface SupervisedServer {
  pid: number;
  exited: Promise<ChildExit>;
  stop(): Promise<void>;
}

export interface Supervisor<T extends SupervisedServer> {
  /** The server running now (a new one after each restart). */
  current(): T;
  /** Stops supervising, then stops the server (waiting for a restart under way first). */
  stop(): Promise<void>;
}

function describeExit(exit: ChildExit): string {
  return exit.signal ? `signal ${exit.signal}` : `exit code ${exit.code}`;
}

/**
 * Restarts `name` whenever it exits without being asked to, with `restart` (which must bring it
 * back at the same address), logging one line once it is back (and one per failed attempt, backing
 * off from half a second to ten).
 */
export function supervise<T extends SupervisedServer>(input: {
  name: string;
  log: Logger;
  first: T;
  restart: () => Promise<T>;
}): Supervisor<T> {
  let current = input.first;
  let stopping = false;
  let restarting: Promise<void> | null = null;

  const restartAfter = async (exit: ChildExit) => {
    // wall time: only to say how long the restart took
    const since = Date.now();
    for (let attempt = 1; !stopping; attempt++) {
      try {
        const next = await input.restart();
        if (stopping) {
          await next.stop();
          return;
        }
        current = next;
        follow(next);
        input.log.warn(
          { server: input.name, serverPid: next.pid, restartedInMs: Date.now() - since },
          `${input.name} stopped unexpectedly (${describeExit(exit)}) and was restarted`,
        );
        return;
      } catch (error) {
        const delayMs = Math.min(10_000, 500 * 2 ** (attempt - 1));
        input.log.warn(
          { server: input.name, attempt, retryInMs: delayMs, cause: (error as Error).message },
          `${input.name} stopped unexpectedly (${describeExit(exit)}) and did not restart yet`,
        );
        // wall time: back-off between restart attempts
        await new Promise((resolve) => setTimeout(resolve, delayMs));
      }
    }
  };

  const follow = (server: T) => {
    void server.exited.then((exit) => {
      if (stopping || server !== current) return;
      restarting = restartAfter(exit).finally(() => {
        restarting = null;
      });
    });
  };
  follow(current);

  return {
    current: () => current,
    stop: async () => {
      stopping = true;
      await restarting;
      await current.stop();
    },
  };
}
