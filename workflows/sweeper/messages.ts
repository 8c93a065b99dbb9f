/** The orphan sweeper's workflow type, for the Schedule that starts it. */
export const orphanSweeperType = 'orphanSweeper';
