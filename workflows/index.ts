// The workflows the worker hosts (its bundle's entry point).
export { bookingRepair } from './booking-repair/workflow.ts';
export { metalWorkflow } from './metal/workflow.ts';
export { spotPreemption } from './preemption/workflow.ts';
export { reservationLifecycle } from './reservation/workflow.ts';
export { rolloutWorkflow } from './rollout/workflow.ts';
export { orphanSweeper } from './sweeper/workflow.ts';
