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

function isUniqueViolation(error: unknown): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: string }).code === '23505';
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
    if (isUniqueViolation(error)) throw new ComputeError('CONFLICT', message, details);
    throw error;
  }
}
