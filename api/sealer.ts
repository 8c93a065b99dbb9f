import type { Config } from '../core/config.ts';
import { ComputeError } from '../domain/errors.ts';
import { createSealer, type Sealer } from '../domain/sealing.ts';

/**
 * The sealer of this deployment's secret, for a method that must seal something before it stores
 * it. A process started by `serve` or the dev stack always has the secret (it refuses to start
 * without it); an embedder's `handler` without the `secret` option answers UNSUPPORTED here, and
 * stores nothing.
 */
export function apiSealer(config: Pick<Config, 'BETTER_COMPUTE_SECRET'>, what: string): Sealer {
  if (!config.BETTER_COMPUTE_SECRET) {
    throw new ComputeError(
      'UNSUPPORTED',
      `this server has no deployment secret (BETTER_COMPUTE_SECRET, or the \`secret\` option of betterCompute()), so it cannot seal ${what}: configure one`,
    );
  }
  return createSealer(config.BETTER_COMPUTE_SECRET);
}
