import { ApplicationFailure } from '@temporalio/common';
import { errorCodeTraits, isComputeError } from '../domain/errors.ts';

/**
 * Runs an activity body and turns a ComputeError into an ApplicationFailure whose `type` is its code
 * and whose retryability comes from the error table; anything else is rethrown for Temporal to retry.
 */
export async function asActivity<T>(body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (error) {
    if (isComputeError(error)) {
      throw ApplicationFailure.create({
        type: error.code,
        message: error.message,
        nonRetryable: !errorCodeTraits[error.code].retryable,
        details: error.details ? [error.details] : [],
      });
    }
    throw error;
  }
}
