import path from 'node:path';
import { type BuildOptions, build, type Metafile } from 'esbuild';
import { describe, expect, test } from 'vitest';

// The typed client (`better-compute/client`) runs in browsers and small scripts: bundled, it must
// hold only client/ and domain/ code and zod, never a server module or a server-side package.
// esbuild follows exactly the imports that load at run time (it drops `import type`), so its
// metafile is the list of what the client really pulls in.

const root = path.resolve(import.meta.dirname, '../..');

const serverFolders = [
  'api',
  'db',
  'core',
  'server',
  'gateway',
  'iam',
  'activities',
  'workflows',
  'temporal',
  'events',
];
const serverPackages = ['pg', 'kysely', '@temporalio/', '@grpc/', 'pino', 'hono'];

/** The package an input of the bundle comes from (`zod`, `@temporalio/client`), or null for project code. */
function packageOf(input: string): string | null {
  const at = input.lastIndexOf('node_modules/');
  if (at === -1) return null;
  const [first, second] = input.slice(at + 'node_modules/'.length).split('/');
  return first!.startsWith('@') ? `${first}/${second}` : first!;
}

/** Why an input must not be in the client's bundle, or null when it may. */
function offence(input: string): string | null {
  const pkg = packageOf(input);
  if (pkg) {
    const banned = serverPackages.find((p) => (p.endsWith('/') ? pkg.startsWith(p) : pkg === p));
    if (banned) return `server package ${pkg}`;
    return pkg === 'zod' ? null : `package ${pkg} (only zod is expected)`;
  }
  const folder = input.split('/')[0]!;
  if (serverFolders.includes(folder)) return `server folder ${folder}/`;
  return folder === 'client' || folder === 'domain' ? null : `project file outside client/ and domain/`;
}

async function bundle(options: BuildOptions): Promise<Metafile> {
  const result = await build({
    bundle: true,
    platform: 'node',
    format: 'esm',
    write: false,
    metafile: true,
    logLevel: 'silent',
    absWorkingDir: root,
    outdir: 'out',
    ...options,
  });
  return result.metafile!;
}

function offending(metafile: Metafile): string[] {
  return Object.keys(metafile.inputs).flatMap((input) => {
    const why = offence(input);
    return why ? [`${input}: ${why}`] : [];
  });
}

describe('the typed client bundle', () => {
  test('holds only client/ and domain/ code and zod: no server folder, no pg, kysely, Temporal, gRPC, pino or hono', async () => {
    const metafile = await bundle({ entryPoints: ['client/index.ts'] });
    const inputs = Object.keys(metafile.inputs);
    expect(offending(metafile)).toEqual([]);
    // The client imports the one error table and the protocol header from domain/.
    expect(inputs).toContain('client/index.ts');
    expect(inputs).toContain('domain/errors.ts');
    expect(inputs).toContain('domain/http-protocol.ts');
    // Nothing is left to load at run time either (no node: built-in), so it bundles for a browser too.
    const [output] = Object.values(metafile.outputs);
    expect(output!.imports.filter((i) => i.external)).toEqual([]);
  });

  test('the check catches a server module pulled into the bundle', async () => {
    const metafile = await bundle({
      stdin: {
        contents: "export * from './client/index.ts'; export { createDb } from './db/pool.ts';",
        resolveDir: root,
        sourcefile: 'client/leaky.ts',
        loader: 'ts',
      },
    });
    const found = offending(metafile).join('\n');
    expect(found).toContain('db/pool.ts: server folder db/');
    expect(found).toMatch(/node_modules\/pg\/.*: server package pg/);
    expect(found).toMatch(/node_modules\/kysely\/.*: server package kysely/);
  });
});
