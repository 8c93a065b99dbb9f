import { describe, expect, it } from 'vitest';
import { parseConfig } from './config.ts';

describe('configuration', () => {
  it('takes the worker sticky cache size as a count, unset by default, and refuses a bad one naming it', () => {
    expect(parseConfig({}).BETTER_COMPUTE_WORKFLOW_CACHE).toBeUndefined();
    expect(parseConfig({ BETTER_COMPUTE_WORKFLOW_CACHE: '250' }).BETTER_COMPUTE_WORKFLOW_CACHE).toBe(250);
    for (const bad of ['-1', '2.5', 'many'])
      expect(() => parseConfig({ BETTER_COMPUTE_WORKFLOW_CACHE: bad })).toThrow(
        /BETTER_COMPUTE_WORKFLOW_CACHE/,
      );
  });
});
