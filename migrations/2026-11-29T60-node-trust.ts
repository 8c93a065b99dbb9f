import { type Kysely, sql } from 'kysely';

/**
 * Node trust: why a certificate was revoked (a renewal or a proved reclaim supersedes it; a
 * retirement, an operator or an approved reclaim revokes it for cause), and an operator's
 * approval that lets the next join of a machine reclaim its node without proof of its key.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    -- NULL on a revoked row: revoked for cause (rows revoked before this migration included).
    ALTER TABLE node_certificates ADD COLUMN revoke_reason text
      CHECK (revoke_reason IN ('superseded', 'reclaimed', 'retired', 'revoked'));

    -- Until then, a join with a token of the node's pool and its hardware key reclaims it
    -- without a reclaim proof (nodes.approveReclaim); used once.
    ALTER TABLE nodes ADD COLUMN reclaim_approved_until timestamptz;
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    ALTER TABLE nodes DROP COLUMN reclaim_approved_until;
    ALTER TABLE node_certificates DROP COLUMN revoke_reason;
  `.execute(db);
}
