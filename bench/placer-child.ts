/**
 * The pool-lease placer in a process of its own (bench/support.ts, `startPlacerInChild`), as a
 * worker runs it in production (temporal/worker.ts): beside the API, not inside its event loop.
 * Its input is one JSON object as its argument. It prints `{"ready":true}` once its placer runs,
 * answers a line `batches` on stdin with `{"batches":N}`, and when stdin ends it stops the placer
 * and prints its last line, `{"batches":N}`, then exits.
 */
import { createInterface } from 'node:readline';
import { createAdmissionCaches } from '../core/admission-caches.ts';
import { createLogger } from '../core/logger.ts';
import { createDb } from '../db/pool.ts';
import { startPoolPlacer } from '../temporal/pool-placer.ts';
import { noLifecycle } from './support.ts';

const input = JSON.parse(process.argv[2]!) as { url: string; pollMs: number; connections: number };
const log = createLogger({ level: 'warn', name: 'bench-placer' });
const handle = createDb(input.url, { max: input.connections, applicationName: 'bench-placer' });
const placer = startPoolPlacer(
  { db: handle.db, log, lifecycle: noLifecycle, caches: createAdmissionCaches() },
  { pollMs: input.pollMs },
);
console.log(JSON.stringify({ ready: true }));
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.trim() === 'batches') console.log(JSON.stringify({ batches: placer.batches }));
}
await placer.stop();
await handle.close();
console.log(JSON.stringify({ batches: placer.batches }));
