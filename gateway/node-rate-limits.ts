import type { GatewayOptions } from './options.ts';
import { KeyedTokenBuckets } from './token-bucket.ts';

type RateOptions = Pick<
  GatewayOptions,
  'reportsPerSecond' | 'reportBurst' | 'inventoryPerMinute' | 'inventoryBurst' | 'maxSessions'
>;

/**
 * Per-node budgets for what costs the database most per message: allocation reports and
 * inventory reports. They are kept by node id across the node's sessions on this gateway (a
 * reconnect does not refill them) and bounded in memory like the sessions.
 */
export class NodeRateLimits {
  private readonly reports: KeyedTokenBuckets;
  private readonly inventory: KeyedTokenBuckets;
  /** Messages refused by these budgets since start. */
  refused = 0;

  constructor(options: RateOptions) {
    const keys = Math.max(1_000, options.maxSessions * 2);
    this.reports = new KeyedTokenBuckets(options.reportsPerSecond, options.reportBurst, keys);
    this.inventory = new KeyedTokenBuckets(options.inventoryPerMinute / 60, options.inventoryBurst, keys);
  }

  /** Whether `nodeId` may send one more message of `kind` now (counts a refusal when not). */
  take(kind: 'report' | 'inventory', nodeId: string): boolean {
    const wait = (kind === 'report' ? this.reports : this.inventory).take(nodeId);
    if (wait > 0) this.refused++;
    return wait === 0;
  }
}
