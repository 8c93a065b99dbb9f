import { ComputeError } from '../domain/errors.ts';

/**
 * The error of a write from a session whose epoch is no longer the node's: INVALID_STATE with
 * `details.fenced`, so the session closes instead of answering a refusal.
 */
export function sessionFenced(): ComputeError {
  return new ComputeError('INVALID_STATE', 'session fenced by a newer epoch', { fenced: true });
}

export function isSessionFenced(error: unknown): boolean {
  return error instanceof ComputeError && error.code === 'INVALID_STATE' && error.details?.fenced === true;
}
