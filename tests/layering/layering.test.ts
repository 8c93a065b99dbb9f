import { execFile } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
const repo = join(import.meta.dirname, '..', '..');
const depcruise = join(repo, 'node_modules', '.bin', 'depcruise');

async function check(cwd: string, folders: string[]) {
  try {
    const { stdout } = await run(depcruise, ['--config', '.dependency-cruiser.cjs', ...folders], { cwd });
    return { failed: false, output: stdout };
  } catch (error) {
    const { stdout, stderr } = error as { stdout: string; stderr: string };
    return { failed: true, output: `${stdout}\n${stderr}` };
  }
}

describe('the layering rule (npm run check:layers)', () => {
  const scratch = mkdtempSync(join(tmpdir(), 'layers-'));
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  function tree(files: Record<string, string>) {
    const dir = mkdtempSync(join(scratch, 'tree-'));
    cpSync(join(repo, '.dependency-cruiser.cjs'), join(dir, '.dependency-cruiser.cjs'));
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: { allowImportingTsExtensions: true } }),
    );
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    return dir;
  }

  it('passes on this repository', async () => {
    // The folders `npm run check:layers` names, read from package.json so the two never differ.
    const script: string = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')).scripts[
      'check:layers'
    ];
    const folders = script.split(' ').slice(3);
    expect(folders).toContain('domain');
    const result = await check(repo, folders);
    expect(result.output).toContain('no dependency violations found');
    expect(result.failed).toBe(false);
  });

  it('fails on a folder importing one above it', async () => {
    const dir = tree({
      'api/handler.ts': 'export const handler = 1;\n',
      'domain/placer.ts': "import { handler } from '../api/handler.ts';\nexport const x = handler;\n",
    });
    const result = await check(dir, ['domain', 'api']);
    expect(result.failed).toBe(true);
    expect(result.output).toContain('domain-imports-only-below: domain/placer.ts → api/handler.ts');
  });

  it('fails on a cycle, even inside one folder', async () => {
    const dir = tree({
      'db/a.ts': "import { b } from './b.ts';\nexport const a = () => b;\n",
      'db/b.ts': "import { a } from './a.ts';\nexport const b = () => a;\n",
    });
    const result = await check(dir, ['db']);
    expect(result.failed).toBe(true);
    expect(result.output).toContain('no-cycles');
  });

  it('fails on a runtime import where only types may cross (the client from the API)', async () => {
    const dir = tree({
      'api/registry.ts': 'export const methods = {};\nexport type Methods = typeof methods;\n',
      'client/typed.ts': "import type { Methods } from '../api/registry.ts';\nexport type M = Methods;\n",
      'client/loaded.ts': "import { methods } from '../api/registry.ts';\nexport const m = methods;\n",
    });
    const result = await check(dir, ['client', 'api']);
    expect(result.failed).toBe(true);
    expect(result.output).toContain('client/loaded.ts → api/registry.ts');
    expect(result.output).not.toContain('client/typed.ts → api/registry.ts');
  });
});
