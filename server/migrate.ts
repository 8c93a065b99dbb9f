import { migrateToLatest } from '../db/migrate.ts';
import { createDb } from '../db/pool.ts';

/** Brings the database at `databaseUrl` to the newest migration (all or nothing) and says which ran. */
export async function migrateDatabase(databaseUrl: string): Promise<{ applied: string[] }> {
  const handle = createDb(databaseUrl, { max: 1 });
  try {
    return await migrateToLatest(handle.db);
  } finally {
    await handle.close();
  }
}
