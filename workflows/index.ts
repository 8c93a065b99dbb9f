// The workflows the worker hosts (its bundle's entry point).
export { reservationLifecycle } from './reservation/workflow.ts';
export { orphanSweeper } from './sweeper/workflow.ts';
