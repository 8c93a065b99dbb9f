import type { Interval, PlacerNode } from '../domain/placer.ts';

/** How long a node read for placement is reused at most before it is read again. */
const defaultTtlMs = 10_000;
/**
 * The share of the TTL by which each entry's life is shortened at random. Without it, the nodes a
 * burst of creates read together expired together 10 s later, and every create then read its warm
 * nodes again at once: the open loop's slowest creates, all in the same 300 ms (bench/README.md,
 * 2026-12-06).
 */
const ttlSpread = 0.5;
/** How many nodes per pool this process keeps warm: those it booked or read last. */
const warmPerPool = 128;
/**
 * The longest a claim outlives its release (a caller that never released it): far longer than a
 * placement transaction, short enough that a leaked claim only hides a node for a moment.
 */
const claimLimitMs = 5_000;
/**
 * How long the room a whole read found steers the samples: long enough that a busy pool is read
 * whole every few seconds at most, short enough that room freed elsewhere is not overlooked long.
 */
const roomTtlMs = 15_000;
/** How far short of a caller's horizon a shared whole read may end (a counter-offer's far edge). */
const horizonEdgeMs = 60_000;

/** A whole read of a pool: when it began (performance.now()), the span its bookings cover, its nodes. */
export interface WholeRead {
  startedAt: number;
  horizon: Interval;
  nodes: Promise<PlacerNode[]>;
}

/**
 * The free atoms per node a whole read of the pool found over `window`, less this process's
 * bookings since: where a sample looks first once most of a pool is booked.
 */
interface Room {
  window: Interval;
  at: number;
  free: Map<string, number>;
  ids: string[];
}

interface Entry {
  node: PlacerNode;
  /** The bookings loaded cover this span; a window outside it is read afresh. */
  horizon: Interval;
  /** When (wall time) it stops being reused: between half the TTL and the TTL after it was read. */
  freshUntil: number;
  /** When (performance.now()) it was read or this process booked on it: a whole read begun before does not replace it. */
  since: number;
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
  readonly #room = new Map<string, Room>();
  /** Whole reads of a pool running now, per pool and class, for callers that arrive meanwhile. */
  readonly #wholeReads = new Map<string, WholeRead>();
  /** Samples that found no fit since the last whole read was stored, per pool and class. */
  readonly #emptySamples = new Map<string, number>();
  /** When the whole read last stored began, per pool and class: an older one ending later is not stored. */
  readonly #storedWholeRead = new Map<string, number>();
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
        now < entry.freshUntil &&
        entry.horizon.start <= window.start &&
        window.end <= entry.horizon.end;
      if (fresh) cached.push(entry.node);
      else missing.push(id);
    }
    return { cached, missing };
  }

  /**
   * Stores nodes just read with their bookings over `horizon`; they become the pool's warm nodes
   * unless `warm` is false (a whole pool's read, whose nodes are found through the room instead).
   */
  store(
    poolId: string,
    deviceClass: string,
    nodes: readonly PlacerNode[],
    horizon: Interval,
    warm = true,
    readStartedAt?: number,
  ): PlacerNode[] {
    const key = `${poolId}/${deviceClass}`;
    let entries = this.#entries.get(key);
    if (!entries) {
      entries = new Map();
      this.#entries.set(key, entries);
    }
    // wall time: when the entries were read, for their TTL
    const at = Date.now();
    const since = performance.now();
    const stored: PlacerNode[] = [];
    for (const node of nodes) {
      // A node read or booked on since a long read began is known better than that read knew it.
      const known = readStartedAt === undefined ? undefined : entries.get(node.id);
      if (known && known.since > readStartedAt! && at < known.freshUntil) stored.push(known.node);
      else {
        // Spread: the nodes of one read (and a burst of reads) are not all read again at one moment.
        const freshUntil = at + this.ttlMs * (1 - ttlSpread * Math.random());
        entries.set(node.id, { node, horizon, freshUntil, since });
        stored.push(node);
      }
    }
    if (warm)
      this.#touch(
        poolId,
        nodes.map((n) => n.id),
      );
    return stored;
  }

  /**
   * Shares a whole read of the pool while it runs (`wholeReadSince`, `wholeReadCovering`). Once
   * read, the nodes are cached (keeping what this process read or booked since it began) and their
   * free atoms over `window` become the pool's room.
   */
  shareWholeRead(
    poolId: string,
    deviceClass: string,
    read: WholeRead & { window: Interval },
    freeAtoms: (node: PlacerNode, window: Interval) => number,
  ): void {
    const key = `${poolId}/${deviceClass}`;
    const shared: WholeRead = { startedAt: read.startedAt, horizon: read.horizon, nodes: read.nodes };
    this.#wholeReads.set(key, shared);
    const done = () => {
      if (this.#wholeReads.get(key) === shared) this.#wholeReads.delete(key);
    };
    read.nodes.then(
      (nodes) => {
        done();
        if ((this.#storedWholeRead.get(key) ?? -Infinity) > read.startedAt) return;
        this.#storedWholeRead.set(key, read.startedAt);
        this.#emptySamples.delete(key);
        const stored = this.store(poolId, deviceClass, nodes, read.horizon, false, read.startedAt);
        const free = new Map<string, number>();
        for (const node of stored) {
          const n = freeAtoms(node, read.window);
          if (n > 0) free.set(node.id, n);
        }
        // wall time: the TTL of a heuristic hint, which decides no booking
        this.#room.set(key, { window: read.window, at: Date.now(), free, ids: [...free.keys()] });
      },
      // The reader answers its own failure; the callers sharing it read for themselves.
      done,
    );
  }

  /** Counts a sample that found no fit; answers how many did since the last whole read. */
  countEmptySample(poolId: string, deviceClass: string): number {
    const key = `${poolId}/${deviceClass}`;
    const count = (this.#emptySamples.get(key) ?? 0) + 1;
    this.#emptySamples.set(key, count);
    return count;
  }

  /**
   * A whole read of the pool begun after `began` (performance.now()) whose bookings cover
   * `horizon` (to a minute at its end, a counter-offer's far edge): the running one if it began
   * after; else, once the running one has ended, the next one, which the first caller to get there
   * begins with `read` and shares (`own`). So however many placements need the pool whole at once,
   * it is read once at a time, and each answer reflects every booking made before it was asked.
   */
  async wholeReadSince(
    poolId: string,
    deviceClass: string,
    input: {
      began: number;
      window: Interval;
      horizon: Interval;
      read: () => Promise<PlacerNode[]>;
      freeAtoms: (node: PlacerNode, window: Interval) => number;
    },
  ): Promise<{ nodes: Promise<PlacerNode[]>; own: boolean }> {
    const key = `${poolId}/${deviceClass}`;
    for (;;) {
      const running = this.#wholeReads.get(key);
      const covers =
        running &&
        running.horizon.start <= input.horizon.start &&
        running.horizon.end >= input.horizon.end - horizonEdgeMs;
      if (!running || !covers) break;
      if (running.startedAt >= input.began) return { nodes: running.nodes, own: false };
      // Its end removes it (shareWholeRead's handler runs first): the next one is begun below.
      await running.nodes.catch(() => undefined);
    }
    const startedAt = performance.now();
    const nodes = input.read();
    this.shareWholeRead(
      poolId,
      deviceClass,
      { startedAt, horizon: input.horizon, window: input.window, nodes },
      input.freeAtoms,
    );
    return { nodes, own: true };
  }

  /** The whole read of the pool running now whose bookings cover `window`, if any. */
  wholeReadCovering(poolId: string, deviceClass: string, window: Interval): WholeRead | undefined {
    const shared = this.#wholeReads.get(`${poolId}/${deviceClass}`);
    if (!shared || shared.horizon.start > window.start || window.end > shared.horizon.end) return undefined;
    return shared;
  }

  /**
   * Up to `size` random nodes that the pool's last whole read found with at least `atLeast` free
   * atoms (less this process's bookings since) over a window starting near `window`'s; [] when it
   * found none left; undefined without such a read in the last 15 s (sample the whole pool then).
   */
  roomSample(
    poolId: string,
    deviceClass: string,
    window: Interval,
    atLeast: number,
    size: number,
  ): string[] | undefined {
    const room = this.#room.get(`${poolId}/${deviceClass}`);
    // wall time: the TTL of a heuristic hint, which decides no booking
    const now = Date.now();
    if (!room || now - room.at >= roomTtlMs || Math.abs(window.start - room.window.start) >= roomTtlMs)
      return undefined;
    const picked = new Set<string>();
    // Random probes, so concurrent placements spread over the room; a room mostly used up by
    // this process's bookings since the read is swept once for what is left.
    for (let probe = 0; probe < size * 4 && picked.size < size && room.ids.length > 0; probe++) {
      const id = room.ids[Math.floor(Math.random() * room.ids.length)]!;
      if ((room.free.get(id) ?? 0) >= atLeast) picked.add(id);
    }
    if (picked.size < size) {
      room.ids = room.ids.filter((id) => room.free.has(id));
      const left = room.ids.filter((id) => room.free.get(id)! >= atLeast && !picked.has(id));
      for (let i = left.length - 1; i >= 0 && picked.size < size; i--) {
        const j = Math.floor(Math.random() * (i + 1));
        [left[i], left[j]] = [left[j]!, left[i]!];
        picked.add(left[i]!);
      }
    }
    return [...picked];
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
    const room = this.#room.get(`${poolId}/${deviceClass}`);
    const free = room?.free.get(booking.nodeId);
    if (room && free !== undefined) {
      if (free > booking.deviceIds.length) room.free.set(booking.nodeId, free - booking.deviceIds.length);
      else room.free.delete(booking.nodeId);
    }
    const entry = this.#entries.get(`${poolId}/${deviceClass}`)?.get(booking.nodeId);
    if (!entry) return;
    entry.since = performance.now();
    const node = entry.node;
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
    this.#room.get(`${poolId}/${deviceClass}`)?.free.delete(nodeId);
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
