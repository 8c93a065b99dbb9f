import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll } from 'vitest';

/** A fresh temporary directory for the tests of the enclosing file or `describe` block, removed after them. */
export function useTempDir(prefix: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A fresh temporary directory for a stack's data (a private PostgreSQL's among it), which the
 * caller removes. It is opened to other users (0755): on a root run the server runs as the postgres
 * user, and a data directory that user cannot reach (mkdtemp's are 0700) is moved to a folder of
 * its own under the temp dir (db/local-postgres.ts), beyond this directory's removal.
 */
export function makeStackDir(prefix: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  chmodSync(dir, 0o755);
  return dir;
}
