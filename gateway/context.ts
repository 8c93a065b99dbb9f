import type { Db } from '../core/database.ts';
import type { ReservationLifecycle } from '../core/deps.ts';
import type { Logger } from '../core/logger.ts';
import type { NodeRateLimits } from './node-rate-limits.ts';
import type { GatewayOptions } from './options.ts';
import type { SessionRegistry } from './registry.ts';

/** What every part of one gateway process shares. */
export interface GatewayContext {
  db: Db;
  log: Logger;
  lifecycle?: ReservationLifecycle;
  options: GatewayOptions;
  registry: SessionRegistry;
  /** Per-node budgets for allocation reports and inventory. */
  rates: NodeRateLimits;
  /** Called after a command's result is stored (benchmarks measure latency with it). */
  onCommandCompleted?: (commandId: string) => void;
}
