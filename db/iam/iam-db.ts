import type { Db } from '../../core/database.ts';
import type { IamDatabase, IamDb } from '../../core/iam-database.ts';
import { ComputeError } from '../../domain/errors.ts';

/**
 * Compute's database handle with the embedded IAM's tables (schema `iam`) added to its type: the
 * one place that view is made. Same pool and connections; it runs nothing.
 */
export function iamDatabase(db: Db): IamDb {
  return db.withTables<IamDatabase>();
}

function pgError(error: unknown): { code?: string; detail?: string } | null {
  return typeof error === 'object' && error !== null ? (error as { code?: string; detail?: string }) : null;
}

/** Runs `write`; a unique violation (a name or id already taken) becomes CONFLICT with `message`. */
export async function conflictOnDuplicate<T>(
  write: () => Promise<T>,
  message: string,
  details?: Record<string, unknown>,
): Promise<T> {
  try {
    return await write();
  } catch (error) {
    if (pgError(error)?.code === '23505') throw new ComputeError('CONFLICT', message, details);
    throw error;
  }
}

/** What a row of each IAM table is called in a NOT_FOUND message. */
const referencedThing: Record<string, string> = {
  tenants: 'tenant',
  identities: 'identity',
  roles: 'role',
  delegations: 'delegation',
};

/**
 * Runs `write`; a foreign-key violation (23503: a caller-supplied tenant, identity, role or
 * delegation that does not exist, or went away since the caller checked) becomes NOT_FOUND. The
 * message is `missing[column]` for the referencing column PostgreSQL names, else one built from
 * the column and the value it lacked. Use it only where every reference is caller-supplied.
 */
export async function notFoundOnMissingReference<T>(
  write: () => Promise<T>,
  missing: Record<string, string> = {},
): Promise<T> {
  try {
    return await write();
  } catch (error) {
    const pg = pgError(error);
    if (pg?.code !== '23503') throw error;
    const match = /^Key \(([a-z_]+)\)=\((.*)\) is not present in table "([a-z_]+)"/.exec(pg.detail ?? '');
    const [, column = '', value = '', table = ''] = match ?? [];
    const what = referencedThing[table] ?? table;
    throw new ComputeError(
      'NOT_FOUND',
      missing[column] ??
        (match ? `${what} ${value} does not exist` : 'a record this refers to does not exist'),
    );
  }
}
