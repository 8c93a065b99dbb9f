import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';

const clientDir = path.resolve(import.meta.dirname, '../../client');

describe('the typed client', () => {
  test('imports no server code at runtime: anything outside client/ is imported as a type only', () => {
    const offending: string[] = [];
    const files = readdirSync(clientDir).filter((f) => f.endsWith('.ts'));
    expect(files.length).toBeGreaterThan(3);
    for (const file of files) {
      const source = readFileSync(path.join(clientDir, file), 'utf8');
      for (const match of source.matchAll(/^(import|export)\s+(type\s+)?[^;]*?from\s+'([^']+)';/gms)) {
        const [statement, , typeOnly, specifier] = match;
        const local = specifier!.startsWith('./');
        if (!local && !typeOnly) offending.push(`${file}: ${statement!.replace(/\s+/g, ' ')}`);
      }
    }
    expect(offending).toEqual([]);
  });
});
