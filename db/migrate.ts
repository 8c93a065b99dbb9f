import { type Kysely, type MigrationProvider, Migrator } from 'kysely';
import { ComputeError } from '../domain/errors.ts';
import { migrationProvider } from '../migrations/index.ts';

export interface MigrationOutcome {
  applied: string[];
}

/**
 * Applies every pending migration in one transaction (PostgreSQL has transactional DDL), so a
 * migration that fails leaves the database exactly as it was.
 */
export async function migrateToLatest(
  db: Kysely<any>,
  provider: MigrationProvider = migrationProvider,
): Promise<MigrationOutcome> {
  const migrator = new Migrator({ db, provider });
  const { error, results } = await migrator.migrateToLatest();
  if (error) {
    const failed = results?.find((r) => r.status === 'Error')?.migrationName ?? 'unknown';
    throw new ComputeError(
      'INTERNAL',
      `migration ${failed} failed and nothing was applied: ${error instanceof Error ? error.message : String(error)}`,
    );
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) };
}
