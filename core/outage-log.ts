import type { ComputeError } from '../domain/errors.ts';
import { asUnavailable, type Dependency, unavailableDependency } from './dependency-unavailable.ts';
import type { Logger } from './logger.ts';

const dependencyNames: Record<Dependency, string> = {
  database: 'PostgreSQL',
  temporal: 'the Temporal server',
};

/** A short reason for the log: the error's code (ECONNREFUSED, 57P01…) or its first line. */
function briefReason(error: unknown): string {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && typeof current === 'object' && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' || typeof code === 'number') return String(code);
    const inner =
      current instanceof AggregateError ? current.errors[0] : (current as { cause?: unknown }).cause;
    if (inner === undefined) break;
    current = inner;
  }
  const message = error instanceof Error ? error.message : String(error);
  return message.split('\n', 1)[0]!.slice(0, 200);
}

interface Outage {
  /** wall time: how long the outage lasted, for the log line only. */
  sinceMs: number;
  failures: number;
  /** The loops or calls that failed during it (named in the recovery line). */
  where: Set<string>;
}

/**
 * The log of a background process's outages of PostgreSQL or Temporal (the classification of
 * core/dependency-unavailable.ts): the first failure of an outage is one concise warn line naming
 * the dependency and that the work is retried, the failures after it are debug lines without a
 * stack, and the first success after it is one info line with how long it lasted and how many
 * attempts failed. `retrying` says what the process does meanwhile ("retries every 500 ms").
 */
export function createOutageLog(log: Logger, retrying: string) {
  const outages = new Map<Dependency, Outage>();

  function note(dependency: Dependency, error: unknown, where: string) {
    const reason = briefReason(error);
    const outage = outages.get(dependency);
    if (outage) {
      outage.failures++;
      outage.where.add(where);
      log.debug({ dependency, where, reason }, 'still out of reach');
      return;
    }
    // wall time: for the recovery line's duration only
    outages.set(dependency, { sinceMs: Date.now(), failures: 1, where: new Set([where]) });
    log.warn(
      { dependency, where, reason },
      `${dependencyNames[dependency]} cannot be reached: ${retrying} until it is back`,
    );
  }

  return {
    /**
     * Notes a failure: true when `error` says a dependency is out of reach (logged here, once per
     * outage), false for anything else (the caller logs it as it would have).
     */
    failed(error: unknown, where: string): boolean {
      const dependency = unavailableDependency(error);
      if (dependency) note(dependency, error, where);
      return dependency !== null;
    },
    /**
     * `failed` for a caller that answers someone: the UNAVAILABLE error to answer (retryable, with
     * `retryAfterSeconds`) when `error` says a dependency is out of reach, null for anything else.
     */
    unavailable(error: unknown, where: string): ComputeError | null {
      const mapped = asUnavailable(error);
      if (mapped) note(mapped.details?.dependency as Dependency, error, where);
      return mapped;
    },
    /**
     * Notes that `dependency` answered (call it after a statement or call that reached it): ends
     * its outage, if any, with one info line.
     */
    reachable(dependency: Dependency): void {
      const outage = outages.get(dependency);
      if (!outage) return;
      outages.delete(dependency);
      log.info(
        {
          dependency,
          downForMs: Date.now() - outage.sinceMs, // wall time: for the log only
          failedAttempts: outage.failures,
          where: [...outage.where],
        },
        `${dependencyNames[dependency]} is reachable again`,
      );
    },
    /** Whether an outage of `dependency` is under way (the last thing heard of it was a failure). */
    isDown(dependency: Dependency): boolean {
      return outages.has(dependency);
    },
  };
}

export type OutageLog = ReturnType<typeof createOutageLog>;
