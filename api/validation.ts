import type { z } from 'zod';
import { ComputeError } from '../domain/errors.ts';

/** The path of a zod issue as people write it: `devices[0].count`. */
export function issuePath(path: ReadonlyArray<PropertyKey>): string {
  let out = '';
  for (const part of path) {
    if (typeof part === 'number') out += `[${part}]`;
    else out += out ? `.${String(part)}` : String(part);
  }
  return out;
}

/**
 * Validates `value` against `schema`; the first problem becomes INVALID_INPUT whose message names
 * the field (unknown fields included) and whose details list every issue.
 */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issues = result.error.issues.map((issue) => {
    const at = issuePath(issue.path);
    if (issue.code === 'unrecognized_keys') {
      const keys = issue.keys.map((k) => (at ? `${at}.${k}` : k));
      return {
        field: keys[0] ?? at,
        message: `unknown field${keys.length > 1 ? 's' : ''} ${keys.join(', ')}`,
      };
    }
    return { field: at || '(body)', message: issue.message };
  });
  const first = issues[0]!;
  throw new ComputeError('INVALID_INPUT', `${first.field}: ${first.message}`, { issues });
}

/** How deep objects and arrays may nest in an input; no method's schema needs more than a few. */
export const maxInputDepth = 32;

// A NUL cannot be stored in a PostgreSQL text value, and a lone surrogate is not Unicode at all
// (the driver would silently store U+FFFD instead), so neither may reach a handler.
// biome-ignore lint/suspicious/noControlCharactersInRegex: the NUL is what this looks for.
const forbiddenCharacter = /\u0000|\p{Cs}/u;

function describeForbidden(text: string): string {
  return text.includes('\u0000')
    ? 'contains a NUL character (\\u0000), which no field accepts'
    : 'contains a lone UTF-16 surrogate, which is not valid Unicode';
}

/**
 * Refuses, before any schema or handler sees it, an input that nests objects or arrays deeper
 * than `maxDepth` or holds a string (a value or a key, at any depth) with a NUL character or a
 * lone surrogate: INVALID_INPUT naming the path. Only arrays and plain objects are walked, so the
 * walk is bounded by the depth whatever the value (a cycle included).
 */
export function assertSafeInput(value: unknown, maxDepth = maxInputDepth): void {
  const refuse = (path: PropertyKey[], message: string): never => {
    const field = issuePath(path) || '(body)';
    throw new ComputeError('INVALID_INPUT', `${field}: ${message}`, {
      issues: [{ field, message }],
    });
  };
  const walk = (node: unknown, path: PropertyKey[]): void => {
    if (typeof node === 'string') {
      if (forbiddenCharacter.test(node)) refuse(path, describeForbidden(node));
      return;
    }
    if (node === null || typeof node !== 'object') return;
    const isArray = Array.isArray(node);
    if (!isArray && Object.getPrototypeOf(node) !== Object.prototype && Object.getPrototypeOf(node) !== null)
      return;
    if (path.length >= maxDepth) refuse(path, `nests deeper than ${maxDepth} levels`);
    if (isArray) {
      for (let index = 0; index < node.length; index++) walk(node[index], [...path, index]);
      return;
    }
    for (const [key, item] of Object.entries(node)) {
      if (forbiddenCharacter.test(key)) refuse(path, `a key ${describeForbidden(key)}`);
      walk(item, [...path, key]);
    }
  };
  walk(value, []);
}
