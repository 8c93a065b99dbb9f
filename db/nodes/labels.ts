import { sql } from 'kysely';
import type { Db } from '../../core/database.ts';

/**
 * Sets operator labels (source `operator`) on nodes, one `{ nodeId, key, value }` each, replacing
 * the operator's earlier value of that key. Idempotent. Placement counts them like any label not
 * under `bc.dev/` (a gang's `topologyKey`, a request's `nodeLabels` selector).
 */
export async function setOperatorLabels(
  db: Db,
  labels: ReadonlyArray<{ nodeId: string; key: string; value: string }>,
): Promise<void> {
  if (labels.length === 0) return;
  await sql`
    INSERT INTO node_labels (node_id, key, value, source)
    SELECT n, k, v, 'operator'
    FROM unnest(${labels.map((l) => l.nodeId)}::text[], ${labels.map((l) => l.key)}::text[],
                ${labels.map((l) => l.value)}::text[]) AS t(n, k, v)
    ON CONFLICT (node_id, source, key) DO UPDATE SET value = EXCLUDED.value`.execute(db);
}

/**
 * Splits a pool's nodes, in name order, into `values.length` runs of (nearly) equal size and labels
 * each run with one value of `key`: how the dev stack gives its simulated fleet fabric domains.
 * Answers how many nodes carry each value.
 */
export async function labelPoolInRuns(
  db: Db,
  input: { poolId: string; key: string; values: readonly string[] },
): Promise<Record<string, number>> {
  const nodes = await db
    .selectFrom('nodes')
    .select('id')
    .where('pool_id', '=', input.poolId)
    .orderBy('name')
    .execute();
  const run = Math.ceil(nodes.length / input.values.length);
  const labels = nodes.map((n, i) => ({
    nodeId: n.id,
    key: input.key,
    value: input.values[Math.floor(i / run)]!,
  }));
  await setOperatorLabels(db, labels);
  const counts: Record<string, number> = {};
  for (const l of labels) counts[l.value] = (counts[l.value] ?? 0) + 1;
  return counts;
}
