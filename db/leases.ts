import { sql, type Transaction } from 'kysely';
import type { Database, Db } from '../core/database.ts';
import { ComputeError } from '../domain/errors.ts';

type Trx = Transaction<Database>;

/** A named lease as its holder knows it: who, under which epoch, until when (compute_now()). */
export interface HeldLease {
  name: string;
  holder: string;
  epoch: number;
  expiresAt: Date;
}

/** The name of a pool's placing lease, as the glossary spells it. */
export function poolLeaseName(poolId: string): string {
  return `pool:${poolId}`;
}

/**
 * Takes or renews the lease `name` for `holder` for `ttlMs`, in one statement: renewed (same
 * epoch) while `holder` holds it unexpired; taken under epoch + 1 when it is free or expired (by
 * `compute_now()`), the same holder included, since a holder whose lease lapsed may still have
 * work in flight under the old epoch. Null when another holder holds it unexpired. Idempotent for
 * the holder.
 */
export async function takeLease(
  db: Db | Trx,
  input: { name: string; holder: string; ttlMs: number },
): Promise<HeldLease | null> {
  const { rows } = await sql<{ epoch: string; expires_at: Date }>`
    INSERT INTO leases (name, holder, epoch, expires_at)
    VALUES (${input.name}, ${input.holder}, 1, compute_now() + make_interval(secs => ${input.ttlMs / 1000}))
    ON CONFLICT (name) DO UPDATE SET
      holder = EXCLUDED.holder,
      epoch = CASE WHEN leases.holder = EXCLUDED.holder AND leases.expires_at > compute_now()
                   THEN leases.epoch ELSE leases.epoch + 1 END,
      acquired_at = CASE WHEN leases.holder = EXCLUDED.holder AND leases.expires_at > compute_now()
                         THEN leases.acquired_at ELSE compute_now() END,
      renewed_at = compute_now(),
      expires_at = EXCLUDED.expires_at
    WHERE leases.holder = EXCLUDED.holder OR leases.expires_at <= compute_now()
    RETURNING epoch, expires_at`.execute(db);
  const row = rows[0];
  return row
    ? { name: input.name, holder: input.holder, epoch: Number(row.epoch), expiresAt: row.expires_at }
    : null;
}

/** Thrown by `fenceLease` when the caller no longer holds the lease at its epoch: roll back. */
export class LeaseLost extends ComputeError {
  constructor(name: string, epoch: number) {
    super(
      'CONFLICT',
      `the lease ${name} is no longer held at epoch ${epoch}: it expired or moved to another holder, so this work is not committed`,
      { lease: name, epoch },
    );
  }
}

/**
 * Renews the lease for `ttlMs` only while `holder` holds it unexpired at `epoch` (a holder at work
 * keeps it while it works). Answers the new expiry, or null when the lease expired or moved on.
 */
export async function renewLease(
  db: Db | Trx,
  lease: { name: string; holder: string; epoch: number; ttlMs: number },
): Promise<Date | null> {
  const { rows } = await sql<{ expires_at: Date }>`
    UPDATE leases SET renewed_at = compute_now(),
      expires_at = compute_now() + make_interval(secs => ${lease.ttlMs / 1000})
    WHERE name = ${lease.name} AND holder = ${lease.holder} AND epoch = ${lease.epoch}
      AND expires_at > compute_now()
    RETURNING expires_at`.execute(db);
  return rows[0]?.expires_at ?? null;
}

/**
 * The fence of a leased commit, in the caller's transaction (run it last, just before commit):
 * renews the lease (renewLease), which locks its row until commit, so no new tenure can begin
 * between this check and the commit. Throws LeaseLost (CONFLICT) when the lease expired or moved
 * on: the caller's transaction must roll back.
 */
export async function fenceLease(
  trx: Trx,
  lease: { name: string; holder: string; epoch: number; ttlMs: number },
): Promise<Date> {
  const expiresAt = await renewLease(trx, lease);
  if (!expiresAt) throw new LeaseLost(lease.name, lease.epoch);
  return expiresAt;
}

/**
 * Gives the lease up at once (a clean shutdown), so the next holder need not wait out its TTL.
 * Only the holder at `epoch` can; otherwise nothing changes. Idempotent.
 */
export async function releaseLease(db: Db, lease: { name: string; holder: string; epoch: number }) {
  await sql`UPDATE leases SET expires_at = compute_now()
            WHERE name = ${lease.name} AND holder = ${lease.holder} AND epoch = ${lease.epoch}
              AND expires_at > compute_now()`.execute(db);
}

/** A lease as stored, or null when nobody ever held it. */
export async function findLease(
  db: Db | Trx,
  name: string,
): Promise<(HeldLease & { expired: boolean }) | null> {
  const { rows } = await sql<{ holder: string; epoch: string; expires_at: Date; expired: boolean }>`
    SELECT holder, epoch, expires_at, expires_at <= compute_now() AS expired FROM leases WHERE name = ${name}`.execute(
    db,
  );
  const row = rows[0];
  return row
    ? { name, holder: row.holder, epoch: Number(row.epoch), expiresAt: row.expires_at, expired: row.expired }
    : null;
}
