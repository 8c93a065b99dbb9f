import {
  type ComputeClient,
  ComputeClientError,
  ComputeConnectionError,
  createComputeClient,
} from '../../client/index.ts';
import type { ReservationView } from '../../domain/reservation-view.ts';

/**
 * Every HTTP answer the load's clients received (retries included, since each try goes through
 * the client's fetch), counted by phase and code: `OK`, an error code of the closed set, `HTTP
 * <status>` for an answer without the envelope, `CONNECTION` when no answer came.
 */
export class AnswerTally {
  phase = 'warm-up';
  readonly byPhase = new Map<string, Map<string, number>>();
  /** Every answer other than OK and UNAVAILABLE, with its method and what it said, to classify. */
  readonly notes: AnswerNote[] = [];

  record(code: string): void {
    let counts = this.byPhase.get(this.phase);
    if (!counts) {
      counts = new Map();
      this.byPhase.set(this.phase, counts);
    }
    counts.set(code, (counts.get(code) ?? 0) + 1);
  }

  note(note: Omit<AnswerNote, 'phase'>): void {
    this.notes.push({ phase: this.phase, ...note });
  }

  /**
   * A try counted as `code` was made again by the client (its retry policy): also counted as
   * `<code> retried`, so `code` minus `<code> retried` is the requests that ended with it.
   */
  retried(code: string): void {
    this.record(`${code} retried`);
  }

  count(code: string, phase = this.phase): number {
    return this.byPhase.get(phase)?.get(code) ?? 0;
  }

  /** The codes seen in every phase, as `{ phase: { code: n } }`. */
  toJSON(): Record<string, Record<string, number>> {
    return Object.fromEntries(
      [...this.byPhase].map(([phase, counts]) => [phase, Object.fromEntries([...counts].sort())]),
    );
  }

  /** Codes that must never be answered: INTERNAL, and anything without the envelope. */
  untyped(): Array<{ phase: string; code: string; n: number }> {
    const bad: Array<{ phase: string; code: string; n: number }> = [];
    for (const [phase, counts] of this.byPhase) {
      for (const [code, n] of counts)
        if (code === 'INTERNAL' || code.startsWith('HTTP ')) bad.push({ phase, code, n });
    }
    return bad;
  }
}

/** One answer worth a look: its phase, method (`reservations.extend`), code and what it said. */
export interface AnswerNote {
  phase: string;
  method: string;
  code: string;
  /** The error's message, or the connection error's cause. */
  detail: string;
  /** `details.state` of an INVALID_STATE answer. */
  state?: string;
}

/** What one client did with one reservation, as its answers say. */
export interface ReservationHistory {
  key: string;
  id: string | null;
  /** The `during.end` the create answered. */
  createdEnd: number | null;
  /** Each extend's answer: whether it extended, and the end it answered (null when it failed). */
  extends: Array<{ extended: boolean; end: number | null } | { failed: string }>;
  /** The state the release answered, or why it failed. */
  released: { state: string } | { failed: string } | null;
  /** Why the create failed (after the client's retries), when it did. */
  createFailed?: string;
  /** How long the create took, end to end (ms). */
  createMs?: number;
  createdInPhase: string;
}

export interface LoadOptions {
  baseURL: string;
  token: string;
  tenantId: string;
  poolId: string;
  clients: number;
  tally: AnswerTally;
}

function failure(error: unknown): string {
  if (error instanceof ComputeClientError) return error.code;
  if (error instanceof ComputeConnectionError) return 'CONNECTION';
  return error instanceof Error ? error.message : String(error);
}

/** A typed client that retries what is safe to retry, and counts every HTTP answer in `tally`. */
export function countingClient(options: Pick<LoadOptions, 'baseURL' | 'token' | 'tally'>): ComputeClient {
  const tally = options.tally;
  const countedFetch: typeof fetch = async (input, init) => {
    let response: Response;
    const method = String(input).split('/api/compute/')[1]?.replace('/', '.') ?? String(input);
    try {
      response = await fetch(input, init);
    } catch (error) {
      tally.record('CONNECTION');
      const cause = (error as { cause?: { code?: string; message?: string } }).cause;
      tally.note({ method, code: 'CONNECTION', detail: `${cause?.code ?? ''} ${cause?.message ?? error}` });
      throw error;
    }
    let code = response.ok ? 'OK' : `HTTP ${response.status}`;
    try {
      const body = (await response.clone().json()) as {
        error?: { code?: string; message?: string; details?: { state?: string } };
      };
      if (body.error?.code) code = body.error.code;
      if (body.error && code !== 'UNAVAILABLE') {
        const state = body.error.details?.state;
        tally.note({ method, code, detail: body.error.message ?? '', ...(state ? { state } : {}) });
      }
    } catch {
      // not JSON: counted by its status
    }
    // UNAVAILABLE must come as a 503 that says when to retry; anything else is counted as untyped.
    if (code === 'UNAVAILABLE' && (response.status !== 503 || !response.headers.get('retry-after'))) {
      code = `HTTP ${response.status} UNAVAILABLE without Retry-After`;
    }
    tally.record(code);
    return response;
  };
  return createComputeClient({
    baseURL: options.baseURL,
    token: options.token,
    fetch: countedFetch,
    // Long enough to ride out a restart of the database, Temporal or an API process.
    retry: {
      attempts: 14,
      baseDelayMs: 100,
      maxDelayMs: 2_000,
      onRetry: (notice) => {
        if (notice.reason === 'CONNECTION') tally.retried('CONNECTION');
      },
    },
  });
}

/**
 * `clients` concurrent clients, each creating reservations one after another through the real
 * HTTP API, extending most of them once or twice and releasing them (every fourth one is kept until
 * the client keeps its next one), recording what every answer said. `stop()` lets each finish its
 * current cycle; what is still kept is for the caller to release.
 */
export function startLoad(options: LoadOptions) {
  const client = countingClient(options);
  const histories: ReservationHistory[] = [];
  let stopping = false;
  let cycles = 0;

  /** Each client's one reservation kept past its cycle (so some live on through the next fault). */
  const held: Array<ReservationHistory | null> = Array.from({ length: options.clients }, () => null);

  async function release(history: ReservationHistory, reservationId: string) {
    try {
      const released = await client.reservations.release(
        { tenantId: options.tenantId, reservationId },
        // Releasing a released reservation changes nothing: safe to retry after a lost answer.
        { idempotent: true },
      );
      history.released = { state: released.state };
    } catch (error) {
      history.released = { failed: failure(error) };
    }
  }

  async function cycle(clientIndex: number, n: number) {
    const history: ReservationHistory = {
      key: `load-${clientIndex}-${n}`,
      id: null,
      createdEnd: null,
      extends: [],
      released: null,
      createdInPhase: options.tally.phase,
    };
    histories.push(history);
    let reservation: ReservationView;
    // wall time: how long the create took, for the bound on admission's wait for Temporal
    const started = Date.now();
    try {
      reservation = await client.reservations.create({
        tenantId: options.tenantId,
        poolId: options.poolId,
        devices: [{ class: 'gpu', count: 1 + (n % 2) }],
        duration: '10m',
        idempotencyKey: history.key,
      });
    } catch (error) {
      history.createFailed = failure(error);
      return;
    }
    history.createMs = Date.now() - started;
    history.id = reservation.id;
    history.createdEnd = reservation.during?.end ?? null;
    for (let e = 0; e < n % 3; e++) {
      try {
        const answer = await client.reservations.extend({
          tenantId: options.tenantId,
          reservationId: reservation.id,
          by: '1m',
          idempotencyKey: `${history.key}/extend-${e}`,
        });
        history.extends.push({ extended: answer.extended, end: answer.reservation.during?.end ?? null });
      } catch (error) {
        history.extends.push({ failed: failure(error) });
      }
    }
    if (n % 4 === 3) {
      // Kept until the client keeps its next one (or the end), so the pool never fills up.
      const previous = held[clientIndex];
      held[clientIndex] = history;
      if (previous?.id) await release(previous, previous.id);
      return;
    }
    await release(history, reservation.id);
  }

  const running = Array.from({ length: options.clients }, async (_, clientIndex) => {
    for (let n = 0; !stopping; n++) {
      await cycle(clientIndex, n);
      cycles++;
    }
  });

  return {
    client,
    histories,
    get cycles() {
      return cycles;
    },
    /** How many reservations were created (answered) so far. */
    created: () => histories.filter((h) => h.id !== null).length,
    async stop() {
      stopping = true;
      await Promise.all(running);
    },
  };
}

export type Load = ReturnType<typeof startLoad>;
