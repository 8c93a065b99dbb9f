import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

// Only the process mode that signs (the gateway) may load the CA's private key. This checks it by
// the code each mode loads: every module reachable by runtime imports from a mode's entry points.

const repo = path.join(import.meta.dirname, '..', '..');
const importPattern = /^\s*(?:import|export)\s+(?!type\b)[^;]*?\bfrom\s+['"](\.{1,2}\/[^'"]+)['"]/gm;
const dynamicImportPattern = /\bimport\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;

/** The repository-relative paths of every module `entries` load at run time (type imports excluded). */
function reachable(entries: string[]): Set<string> {
  const seen = new Set<string>();
  const queue = [...entries];
  while (queue.length > 0) {
    const file = queue.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const text = readFileSync(path.join(repo, file), 'utf8');
    for (const pattern of [importPattern, dynamicImportPattern]) {
      for (const match of text.matchAll(pattern)) {
        const target = path.relative(repo, path.resolve(path.dirname(path.join(repo, file)), match[1]!));
        if (target.endsWith('.ts') && !target.startsWith('node_modules')) queue.push(target);
      }
    }
  }
  return seen;
}

/** Of `files`, those whose code names the private key's column or the function that opens it. */
function keyReaders(files: Set<string>): string[] {
  return [...files].filter((file) => {
    if (file === 'db/nodes/certificate-authority.ts' || file === 'core/database.ts') return false;
    const text = readFileSync(path.join(repo, file), 'utf8');
    return /private_key_pem|loadSigningCertificateAuthority/.test(text);
  });
}

const modeEntries = {
  // createCompute serves every API method; the webhook dispatcher runs beside it.
  api: ['server/compute.ts', 'events/webhook-dispatcher.ts'],
  worker: ['temporal/worker.ts'],
  gateway: ['gateway/server.ts'],
};

describe('who loads the CA private key', () => {
  it('nothing the api or worker modes load reads it; the gateway does', () => {
    for (const mode of ['api', 'worker'] as const) {
      const files = reachable(modeEntries[mode]);
      expect(files.size).toBeGreaterThan(10);
      expect({ mode, readers: keyReaders(files) }).toEqual({ mode, readers: [] });
      expect(files.has('gateway/server.ts')).toBe(false);
    }
    const gateway = reachable(modeEntries.gateway);
    expect(keyReaders(gateway)).toEqual(['gateway/server.ts']);
    expect(readFileSync(path.join(repo, 'gateway/server.ts'), 'utf8')).toContain(
      'loadSigningCertificateAuthority(',
    );
  });

  it('the API reads the CA certificate through the door that selects only the public part', () => {
    const text = readFileSync(path.join(repo, 'db/nodes/certificate-authority.ts'), 'utf8');
    const door = text.slice(
      text.indexOf('export async function ensureCaCertificate'),
      text.indexOf('export async function loadSigningCertificateAuthority'),
    );
    expect(door).toContain(".select('certificate_pem')");
    expect(door).not.toContain('private_key_pem');
    expect(reachable(modeEntries.api).has('db/nodes/certificate-authority.ts')).toBe(true);
  });
});
