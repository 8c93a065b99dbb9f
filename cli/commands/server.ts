import type { Command } from 'commander';
import { migrateToLatest } from '../../db/migrate.ts';
import { createDb } from '../../db/pool.ts';
import { parseConfig } from '../../server/config.ts';
import { createLogger } from '../../server/logger.ts';

/** Commands that run the control plane itself: `migrate` (and `dev`, `serve`). */
export function registerServerCommands(program: Command) {
  program
    .command('migrate')
    .description('Apply pending database migrations to DATABASE_URL (all or nothing).')
    .option('--json', 'print the result as JSON')
    .action(async (options: { json?: boolean }) => {
      const config = parseConfig();
      const log = createLogger({ level: config.LOG_LEVEL });
      if (!config.DATABASE_URL) {
        throw new Error('DATABASE_URL is not set: point it at the PostgreSQL database to migrate');
      }
      const handle = createDb(config.DATABASE_URL, { max: 1 });
      try {
        const { applied } = await migrateToLatest(handle.db);
        if (options.json) console.log(JSON.stringify({ applied }));
        else console.log(applied.length ? `applied ${applied.join(', ')}` : 'the database is up to date');
        log.debug({ applied }, 'migrations applied');
      } finally {
        await handle.close();
      }
    });
}
