import { defineConfig } from 'vitest/config';

/**
 * The two tests that kill and restart real servers under load, each with servers of its own: the
 * fault matrix (tests/faults) and the production-shaped cluster (tests/cluster, issue 18). They run
 * after the rest of the suite, side by side, so no other file's waits compete with their restarts.
 */
const faultTests = ['tests/faults/fault-matrix.test.ts', 'tests/cluster/cluster-faults.test.ts'];

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 180_000,
    pool: 'forks',
    maxWorkers: 2,
    projects: [
      {
        extends: true,
        test: {
          name: 'suite',
          include: ['**/*.test.ts'],
          exclude: ['node_modules/**', '.data/**', ...faultTests],
          globalSetup: ['tests/global-setup.ts'],
          typecheck: { enabled: true, include: ['**/*.test-d.ts'] },
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'faults',
          include: faultTests,
          // The cluster's first run builds the Temporal server and fetches HAProxy into the tools cache.
          hookTimeout: 900_000,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
