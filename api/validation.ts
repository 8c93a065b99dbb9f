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
