/** The task queue the worker polls unless configured otherwise (BETTER_COMPUTE_TASK_QUEUE). */
export const defaultTaskQueue = 'better-compute';
