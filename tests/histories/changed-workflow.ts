// The lifecycle workflow as a careless change would leave it: a timer added before the first look.
// Replaying recorded histories against it must fail with a determinism error (tests/lifecycle/replay).
import { sleep } from '@temporalio/workflow';
import type { ReservationWorkflowInput } from '../../workflows/reservation/messages.ts';
import { reservationLifecycle as current } from '../../workflows/reservation/workflow.ts';

export async function reservationLifecycle(input: ReservationWorkflowInput) {
  await sleep('1 second');
  return current(input);
}
