import { sql } from 'kysely';
import type { IamDb } from '../../core/iam-database.ts';
import type { UsageRecord } from '../../core/iam-port.ts';
import { notFoundOnMissingReference } from './iam-db.ts';

/** The tenant's budgets that apply to `meter` (its own and the `*` one; only `*` without a meter). */
export async function selectBudgets(
  db: IamDb,
  tenantId: string,
  meter?: string,
): Promise<Array<{ meter: string; limit: number }>> {
  const rows = await db
    .selectFrom('iam.budgets')
    .select(['meter', 'limit_amount'])
    .where('tenant_id', '=', tenantId)
    .where('meter', 'in', meter ? [meter, '*'] : ['*'])
    .execute();
  return rows.map((r) => ({ meter: r.meter, limit: Number(r.limit_amount) }));
}

/** What the tenant used of a meter (`*`: every meter) in the calendar month of `compute_now()`. */
export async function usageThisMonth(db: IamDb, tenantId: string, meter: string): Promise<number> {
  const { rows } = await sql<{ spent: string }>`
    SELECT COALESCE(sum(quantity), 0) AS spent FROM iam.usage_records
    WHERE tenant_id = ${tenantId} AND (${meter} = '*' OR meter = ${meter})
      AND window_start >= date_trunc('month', compute_now())`.execute(db);
  return Number(rows[0]!.spent);
}

/** Records usage; idempotent on each record's key (a retried send is a no-op). */
export async function insertUsageRecords(db: IamDb, records: readonly UsageRecord[]): Promise<void> {
  if (records.length === 0) return;
  await db
    .insertInto('iam.usage_records')
    .values(
      records.map((r) => ({
        idempotency_key: r.idempotencyKey,
        tenant_id: r.tenantId,
        meter: r.meter,
        quantity: r.quantity,
        window_start: r.windowStart,
        window_end: r.windowEnd,
        subject: r.subject,
      })),
    )
    .onConflict((oc) => oc.column('idempotency_key').doNothing())
    .execute();
}

/**
 * Sets a tenant's monthly budget for a meter (`*`: all meters); replaces the previous limit.
 * NOT_FOUND when the tenant does not exist.
 */
export async function upsertBudget(
  db: IamDb,
  budget: { tenantId: string; meter: string; limit: number },
): Promise<void> {
  const upsert = db
    .insertInto('iam.budgets')
    .values({ tenant_id: budget.tenantId, meter: budget.meter, limit_amount: budget.limit })
    .onConflict((oc) =>
      oc
        .columns(['tenant_id', 'meter'])
        .doUpdateSet({ limit_amount: budget.limit, updated_at: sql<Date>`compute_now()` }),
    );
  await notFoundOnMissingReference(() => upsert.execute(), {
    tenant_id: `tenantId: tenant ${budget.tenantId} does not exist`,
  });
}
