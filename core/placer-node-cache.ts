import type { Interval, PlacerNode } from '../domain/placer.ts';

/** How long a node read for placement is reused before it is read again. */
const defaultTtlMs = 10_000;
/** How many nodes per pool this process keeps warm: those it booked or read last. */
const warmPerPool = 128;
/**
 * The longest a claim outlives its release (a caller that never released it): far longer than a
 * placement transaction, short enough that a leaked claim only hides a node for a moment.
 */
const claimLimitMs = 5_000;

interface Entry {
  node: PlacerNode;
  /** The bookings loaded cover this span; a window outside it is read afresh. */
  horizon: Interval;
  at: number;
}

/**
 * Nodes of large pools as the placer last read them, per pool and device class, so a placement
 * reads only the nodes it has not seen lately instead of every candidate each time. A heuristic
 * input only: every booking re-checks the node (schedulable, the atoms' health, attributes and
 * labels) and its bookings and room under its locks in the same statement, a stale entry is
 * dropped when that check fails, and a NoFit answer always comes from a fresh read of the whole
 * pool. This process's own bookings are added to the entries at once; other processes' show up
 * through that check or the TTL.
 */
export class PlacerNodeCache {
  readonly #entries = new Map<string, Map<string, Entry>>();
  readonly #warm = new Map<string, string[]>();
  /** Nodes this process is booking in a transaction still open: claims and their expiry. */
  readonly #claims = new Map<string, { count: number; until: number }>();
  readonly ttlMs: number;

  constructor(ttlMs = defaultTtlMs) {
    this.ttlMs = ttlMs;
  }

  /** The cached nodes among `nodeIds` whose bookings cover `window`, and the ids to read. */
  lookup(
    poolId: string,
    deviceClass: string,
    nodeIds: readonly string[],
    window: Interval,
  ): { cached: PlacerNode[]; missing: string[] } {
    const entries = this.#entries.get(`${poolId}/${deviceClass}`);
    const cached: PlacerNode[] = [];
    const missing: string[] = [];
    // wall time: the TTL of a heuristic cache, which decides no booking
    const now = Date.now();
    for (const id of nodeIds) {
      const entry = entries?.get(id);
      const fresh =
        entry &&
        now - entry.at < this.ttlMs &&
        entry.horizon.start <= window.start &&
        window.end <= entry.horizon.end;
      if (fresh) cached.push(entry.node);
      else missing.push(id);
    }
    return { cached, missing };
  }

  /** Stores nodes just read with their bookings over `horizon`. */
  store(poolId: string, deviceClass: string, nodes: readonly PlacerNode[], horizon: Interval): void {
    const key = `${poolId}/${deviceClass}`;
    let entries = this.#entries.get(key);
    if (!entries) {
      entries = new Map();
      this.#entries.set(key, entries);
    }
    // wall time: when the entries were read, for their TTL
    const at = Date.now();
    for (const node of nodes) entries.set(node.id, { node, horizon, at });
    this.#touch(
      poolId,
      nodes.map((n) => n.id),
    );
  }

  /** Puts `nodeIds` first among the pool's warm nodes. */
  #touch(poolId: string, nodeIds: readonly string[]): void {
    const touched = new Set(nodeIds);
    const rest = (this.#warm.get(poolId) ?? []).filter((id) => !touched.has(id));
    this.#warm.set(poolId, [...touched, ...rest].slice(0, warmPerPool));
  }

  /** Adds this process's booking to the cached node (whether or not its transaction commits). */
  recordBooking(
    poolId: string,
    deviceClass: string,
    booking: {
      nodeId: string;
      deviceIds: readonly string[];
      window: Interval;
      resources: Record<string, number>;
    },
  ): void {
    this.#touch(poolId, [booking.nodeId]);
    const node = this.#entries.get(`${poolId}/${deviceClass}`)?.get(booking.nodeId)?.node;
    if (!node) return;
    const booked = new Set(booking.deviceIds);
    for (const device of node.devices) if (booked.has(device.id)) device.bookings.push(booking.window);
    for (const [resource, amount] of Object.entries(booking.resources)) {
      if (amount > 0)
        node.host[resource as keyof PlacerNode['host']]?.bookings.push({ ...booking.window, amount });
    }
  }

  /** Forgets a node whose booking found it changed. */
  forget(poolId: string, deviceClass: string, nodeId: string): void {
    this.#entries.get(`${poolId}/${deviceClass}`)?.delete(nodeId);
  }

  /**
   * Marks a node as being booked by one of this process's open transactions, so this process's
   * other placements plan around it instead of all choosing the same best fit and losing the race
   * for its locks. Answers the release (idempotent); a claim never released lapses after 5 s. A
   * hint only: the locks and the EXCLUDE constraint decide.
   */
  claim(poolId: string, nodeId: string): () => void {
    const key = `${poolId}/${nodeId}`;
    // wall time: the bound on a leaked claim, a hint that decides no booking
    const until = Date.now() + claimLimitMs;
    const claim = this.#claims.get(key);
    if (claim) {
      claim.count++;
      claim.until = until;
    } else this.#claims.set(key, { count: 1, until });
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const current = this.#claims.get(key);
      if (current && --current.count <= 0) this.#claims.delete(key);
    };
  }

  /** Whether one of this process's open transactions is booking the node (see `claim`). */
  claimed(poolId: string, nodeId: string): boolean {
    const claim = this.#claims.get(`${poolId}/${nodeId}`);
    if (!claim) return false;
    // wall time: the same bound on a leaked claim
    if (claim.until > Date.now()) return true;
    this.#claims.delete(`${poolId}/${nodeId}`);
    return false;
  }

  /**
   * The nodes this process booked or read last in the pool, newest first: partly used ones (the
   * tight fits best fit wants) and a recent sample's free ones, looked at before a new sample.
   */
  warmNodes(poolId: string): readonly string[] {
    return this.#warm.get(poolId) ?? [];
  }
}
