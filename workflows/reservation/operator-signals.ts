/**
 * The reservation lifecycle's operator signals: `cancel`, `release` and `confirm`, sent from the
 * Temporal UI or `temporal workflow signal`, applied as the API's methods of the same name are
 * (the update's validator first, then one transaction whose audit row names the Temporal identity).
 * A refused signal is logged and published as `reservation.signal-refused` with its reason.
 */
import { condition, defineSignal, log, proxyActivities, setHandler } from '@temporalio/workflow';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { OperatorSignalActivities } from '../../activities/operator-signals.ts';
// biome-ignore lint/style/noRestrictedImports: a type-only import, erased before bundling
import type { SweeperActivities } from '../../activities/sweeper.ts';
import {
  type OperatorSignalInput,
  operatorCancelSignal,
  parseOperatorSignalInput,
  refusalOf,
  signalOrdinals,
} from '../operator-signals.ts';
import type { LifecycleHolder } from './state.ts';

/** `cancel`: withdraw a reservation that has not started (as `reservations.cancel`). */
export const cancelSignal = operatorCancelSignal;

/** `release`: end the reservation now (as `reservations.release`; a pending one is cancelled). */
export const releaseSignal = defineSignal<[OperatorSignalInput?]>('release');

/** `confirm`: decide the delegated confirmation the reservation awaits (as `confirmations.approve|deny`). */
export const confirmSignal = defineSignal<[{ decision: 'approved' | 'denied' }]>('confirm');

type Activities = OperatorSignalActivities & Pick<SweeperActivities, 'wakePoolPending'>;

/** Installs the three signal handlers on a reservation's lifecycle. */
export function handleOperatorSignals(
  reservationId: string,
  holder: LifecycleHolder,
  options: { activityTimeoutMs?: number | undefined },
): void {
  const acts = proxyActivities<Activities>({
    startToCloseTimeout: options.activityTimeoutMs ?? 30_000,
    retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds' },
  });
  const ordinals = signalOrdinals();

  async function run(
    signal: 'cancel' | 'release' | 'confirm',
    validate: () => { reason?: string; decision?: 'approved' | 'denied' },
  ): Promise<void> {
    const ordinal = ordinals.next(signal);
    await condition(() => holder.snapshot !== null);
    let input: { reason?: string; decision?: 'approved' | 'denied' };
    try {
      input = validate();
      const applied = await acts.applyReservationSignal({ reservationId, signal, ordinal, ...input });
      if (input.decision) holder.intents.confirmation = input.decision;
      holder.wake();
      if (applied.freed && applied.poolId) await acts.wakePoolPending({ poolId: applied.poolId });
    } catch (error) {
      const refusal = refusalOf(error);
      if (!refusal) throw error;
      log.warn('refused an operator signal', { reservationId, signal, ...refusal });
      await acts.refuseReservationSignal({ reservationId, signal, ordinal, ...refusal });
    }
  }

  setHandler(cancelSignal, (raw) =>
    run('cancel', () => {
      const input = parseOperatorSignalInput(raw);
      holder.validateCancel();
      return input;
    }),
  );
  setHandler(releaseSignal, (raw) =>
    run('release', () => {
      const input = parseOperatorSignalInput(raw);
      holder.validateRelease();
      return input;
    }),
  );
  setHandler(confirmSignal, (raw) =>
    run('confirm', () => {
      holder.validateConfirmation(raw);
      return { decision: raw.decision };
    }),
  );
}
