import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import type { Database } from '../../core/database.ts';
import { ComputeError } from '../../domain/errors.ts';
import { newId } from '../../domain/ids.ts';
import { discoveryTokenPattern } from '../../domain/metal-discovery.ts';

type Trx = Transaction<Database>;

const hashSecret = (secret: string) => createHash('sha256').update(secret).digest('hex');

/**
 * Mints a single-use discovery token (`bcdt_<id>.<secret>`) for one machine and what joins with
 * it (its ramdisk, or the system a deploy wrote), valid `ttlSeconds`; answers it in full (stored
 * hashed; the caller puts it in the one command that hands it over: it is useless without the
 * second factor the join checks). Earlier unused tokens of the machine for that role are spent,
 * so only the newest boot can join.
 */
export async function mintDiscoveryToken(
  trx: Trx,
  input: {
    nodeId: string;
    siteId: string;
    role: 'ramdisk' | 'node';
    workflowId: string | null;
    ttlSeconds: number;
  },
): Promise<{ token: string; tokenId: string }> {
  await trx
    .updateTable('discovery_tokens')
    .set({ used_at: sql<Date>`compute_now()` })
    .where('node_id', '=', input.nodeId)
    .where('role', '=', input.role)
    .where('used_at', 'is', null)
    .execute();
  const id = newId('dt');
  const secret = randomBytes(32).toString('base64url');
  await trx
    .insertInto('discovery_tokens')
    .values({
      id,
      node_id: input.nodeId,
      role: input.role,
      site_id: input.siteId,
      workflow_id: input.workflowId,
      secret_hash: hashSecret(secret),
      expires_at: sql<Date>`compute_now() + make_interval(secs => ${input.ttlSeconds})`,
    })
    .execute();
  return { token: `bcdt_${id.slice(3)}.${secret}`, tokenId: id };
}

/**
 * Spends a discovery token in the caller's transaction and answers the machine and site it was
 * minted for. UNAUTHENTICATED (one answer for every reason) for a malformed, unknown, used or
 * expired token.
 */
export async function consumeDiscoveryToken(
  trx: Trx,
  token: string,
): Promise<{ tokenId: string; nodeId: string; siteId: string; role: 'ramdisk' | 'node' }> {
  const refused = (reason: string) =>
    new ComputeError('UNAUTHENTICATED', 'the discovery token is invalid, expired or used', { reason });
  const match = discoveryTokenPattern.exec(token.trim());
  if (!match) throw refused('malformed');
  const id = `dt_${match[1]}`;
  const row = await trx
    .selectFrom('discovery_tokens')
    .where('id', '=', id)
    .select(['node_id', 'site_id', 'role', 'secret_hash'])
    .forUpdate()
    .executeTakeFirst();
  if (!row) throw refused('unknown');
  const given = Buffer.from(hashSecret(match[2]!), 'hex');
  const stored = Buffer.from(row.secret_hash, 'hex');
  if (given.length !== stored.length || !timingSafeEqual(given, stored)) throw refused('secret');
  const spent = await trx
    .updateTable('discovery_tokens')
    .set({ used_at: sql<Date>`compute_now()` })
    .where('id', '=', id)
    .where('used_at', 'is', null)
    .where(sql<boolean>`expires_at > compute_now()`)
    .executeTakeFirst();
  if (Number(spent.numUpdatedRows) === 0) throw refused('used or expired');
  return { tokenId: id, nodeId: row.node_id, siteId: row.site_id, role: row.role };
}
