import { holdHeartbeatSeconds } from '../domain/holds.ts';
import type { Compute } from '../server/compute.ts';
import type { ClientMethods, RegistryOf } from './types.ts';

/** What withHold needs of a client: its `holds` methods. */
type HoldsClient = Pick<ClientMethods<RegistryOf<Compute>>, 'holds'>;

/** A hold as the API answers it. */
export type Hold = Awaited<ReturnType<HoldsClient['holds']['create']>>;

export interface WithHoldOptions {
  tenantId: string;
  /** What the holder adds to its name (default `withHold`) and its pid (default this process's). */
  path?: string;
  pid?: number;
  /** Heartbeat interval (default 60 s; the TTL is three of them). */
  heartbeatSeconds?: number;
  idempotencyKey?: string;
}

/**
 * Takes a hold of `kind` on `target`, runs `fn` while heartbeating it, and always releases it,
 * whether `fn` returns or throws. A refused hold rejects with the API's CAPACITY_UNAVAILABLE (its
 * message is the exact sentence) and `fn` never runs. `fn` gets the hold and an AbortSignal that
 * aborts when a heartbeat is refused (the hold was lost).
 */
export async function withHold<T>(
  client: HoldsClient,
  kind: string,
  target: string,
  fn: (hold: Hold, lost: AbortSignal) => Promise<T>,
  options: WithHoldOptions,
): Promise<T> {
  const hold = await client.holds.create({
    tenantId: options.tenantId,
    kind,
    target,
    path: options.path ?? 'withHold',
    pid: options.pid ?? process.pid,
    ...(options.idempotencyKey ? { idempotencyKey: options.idempotencyKey } : {}),
    ttlSeconds: 3 * (options.heartbeatSeconds ?? holdHeartbeatSeconds),
  });
  const lost = new AbortController();
  // wall time: the holder's heartbeat cadence, not a decision
  const timer = setInterval(
    () => {
      client.holds.heartbeat({ tenantId: options.tenantId, holdId: hold.id }).catch((error: unknown) => {
        if ((error as { code?: string }).code !== 'UNAVAILABLE') lost.abort(error);
      });
    },
    (options.heartbeatSeconds ?? holdHeartbeatSeconds) * 1000,
  );
  try {
    return await fn(hold, lost.signal);
  } finally {
    clearInterval(timer);
    await client.holds.release({ tenantId: options.tenantId, holdId: hold.id });
  }
}
