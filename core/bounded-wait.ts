/**
 * Waits for `work` at most `ms`: answers true when it settled in time, false when the wait ran
 * out. The work goes on in the background either way (its failures are the caller's to catch):
 * for calls after a commit (a lifecycle start or wake-up) that must never hold an answer or a
 * stream while Temporal or its worker is down.
 */
export async function waitAtMost(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  // wall time: how long an answer waits on a call after its commit, not a decision
  const ranOut = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([work.then(() => true as const), ranOut]);
  } finally {
    clearTimeout(timer);
  }
}
