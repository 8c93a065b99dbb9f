/**
 * The deployment secret (BETTER_COMPUTE_SECRET) of the processes the tests start: the API and
 * gateway fixtures, and, through the global setup, any child process that inherits the
 * environment. A fixed value, so a test can seal or open what a fixture stored.
 */
export const testDeploymentSecret = 'better-compute-tests-deployment-secret-0123456789';
