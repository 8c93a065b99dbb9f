import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import type { OutageLog } from '../core/outage-log.ts';
import type { Sealer } from '../domain/sealing.ts';
import type { NodeRateLimits } from './node-rate-limits.ts';
import type { GatewayOptions } from './options.ts';
import type { SessionRegistry } from './registry.ts';

/** What every part of one gateway process shares. */
export interface GatewayContext {
  db: Db;
  log: Logger;
  /** PostgreSQL or Temporal out of reach: one line per outage, not a stack per failed attempt. */
  outage: OutageLog;
  lifecycle?: ReservationLifecycle;
  options: GatewayOptions;
  registry: SessionRegistry;
  /** Per-node budgets for allocation reports and inventory. */
  rates: NodeRateLimits;
  /** Opens sealed values sent on a stream (a BMC's credential to its site agent). */
  sealer?: Sealer;
  /** Command delivery: sessions tell it when their node's queued commands may go now. */
  commands?: { sessionOpened(nodeId: string): void; nodeProgressed(nodeId: string): void };
  /** Called after a command's result is stored (benchmarks measure latency with it). */
  onCommandCompleted?: (commandId: string) => void;
}
