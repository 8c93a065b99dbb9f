/**
 * Signals an operator sends from the Temporal UI or CLI (`temporal workflow signal`), for any
 * workflow that takes them. A signal cannot answer: a workflow validates it as it would the update
 * or API method of the same name, applies it through an activity (one transaction, its audit row
 * naming the Temporal identity that sent it), and publishes a refusal as an event instead of an
 * answer. Usage in a workflow:
 *
 *   const ordinals = signalOrdinals();
 *   setHandler(operatorCancelSignal, async (input) => {
 *     const ordinal = ordinals.next('cancel');   // pass it to the activity: it finds the sender
 *     ...                                         // (identifyOperatorSignal in activities/operator-signals.ts)
 *   });
 */
import { ActivityFailure, ApplicationFailure, defineSignal } from '@temporalio/workflow';

/** What `cancel` and `release` carry (optional): why, for the audit row. */
export interface OperatorSignalInput {
  reason?: string;
}

/** `cancel`: withdraw what the workflow is doing (a reservation that has not started, a preemption, a repair). */
export const operatorCancelSignal = defineSignal<[OperatorSignalInput?]>('cancel');

/**
 * Counts the signals of each name a run received, from 1: the `ordinal`-th signal of a name is the
 * `ordinal`-th WorkflowExecutionSignaled event of that name in the run's history (signals are
 * delivered in history order), which is how an activity finds who sent it.
 */
export function signalOrdinals() {
  const counts = new Map<string, number>();
  return {
    next(name: string): number {
      const n = (counts.get(name) ?? 0) + 1;
      counts.set(name, n);
      return n;
    },
  };
}

/** The typed refusal in a validator's or an activity's failure: its code and message, else null. */
export function refusalOf(error: unknown): { code: string; message: string } | null {
  const failure =
    error instanceof ActivityFailure && error.cause instanceof ApplicationFailure
      ? error.cause
      : error instanceof ApplicationFailure
        ? error
        : null;
  if (!failure) return null;
  return { code: failure.type ?? 'INTERNAL', message: failure.message };
}

/** The optional `{ reason }` of `cancel`/`release`, or an INVALID_INPUT failure naming what is wrong. */
export function parseOperatorSignalInput(input: unknown): OperatorSignalInput {
  if (input === undefined || input === null) return {};
  const reason = typeof input === 'object' ? (input as Record<string, unknown>).reason : undefined;
  const extra =
    typeof input === 'object' && !Array.isArray(input)
      ? Object.keys(input as object).filter((k) => k !== 'reason')
      : ['(not an object)'];
  if (extra.length > 0 || (reason !== undefined && (typeof reason !== 'string' || reason.length > 500))) {
    throw ApplicationFailure.create({
      type: 'INVALID_INPUT',
      nonRetryable: true,
      message: `the signal's input is {} or { "reason": "<at most 500 characters>" }${extra.length ? `; unknown: ${extra.join(', ')}` : ''}`,
    });
  }
  return typeof reason === 'string' ? { reason } : {};
}
