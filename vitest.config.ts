import { defineConfig } from 'vitest/config';

/**
 * The two tests that kill and restart real servers under load, each with servers of its own: the
 * fault matrix (tests/faults) and the production-shaped cluster (tests/cluster, issue 18). They run
 * after the rest of the suite and one after the other: side by side they drove a 2-core machine to a
 * load of 15, and their recoveries then ran past their waits.
 */
const faultMatrix = 'tests/faults/fault-matrix.test.ts';
const clusterFaults = 'tests/cluster/cluster-faults.test.ts';

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
          exclude: ['node_modules/**', '.data/**', faultMatrix, clusterFaults],
          globalSetup: ['tests/global-setup.ts'],
          typecheck: { enabled: true, include: ['**/*.test-d.ts'] },
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: { name: 'faults', include: [faultMatrix], hookTimeout: 300_000, sequence: { groupOrder: 1 } },
      },
      {
        extends: true,
        test: {
          name: 'cluster',
          include: [clusterFaults],
          // Its first run builds the Temporal server and fetches HAProxy into the tools cache.
          hookTimeout: 900_000,
          sequence: { groupOrder: 2 },
        },
      },
    ],
  },
});
