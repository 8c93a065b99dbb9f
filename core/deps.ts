import type { Client } from '@temporalio/client';
import type { PreemptionSummary } from '../domain/preemption.ts';
import type { AdmissionCaches } from './admission-caches.ts';
import type { Config } from './config.ts';
import type { Db } from './database.ts';
import type { IamPort } from './iam-port.ts';
import type { Logger } from './logger.ts';

/** Wake-ups the API sends to a reservation's lifecycle workflow after its own transaction commits. */
export type LifecycleSignal =
  | { type: 'release' }
  | { type: 'cancel' }
  /** An extend committed; `end` (epoch ms) lets the workflow confirm it holds the new end. */
  | { type: 'extended'; end?: number }
  | { type: 'capacityFreed'; poolId: string }
  | { type: 'confirmation'; decision: 'approved' | 'denied' }
  /**
   * Look again now (e.g. a node of the reservation connected, disconnected or changed health).
   * `ifRunning`: a lifecycle that has finished (or never ran) is not an error.
   */
  | { type: 'wake'; reason: string; ifRunning?: boolean }
  /** The gateway stored a node's report about one allocation (workflows/reservation `allocationReport`). */
  | { type: 'allocationReport'; allocationId: string; kind: 'bound' | 'failed' | 'released' };

/**
 * The seam between admission (api) and the lifecycle workflows (Temporal). Admission calls
 * `start` after its second transaction commits; starting twice is harmless, and a start that never
 * happens (a crash) is swept up by the schedule, so admission never waits on Temporal.
 */
export interface ReservationLifecycle {
  start(
    reservation: { id: string; tenantId: string; poolId: string; state: string },
    reason?: string,
  ): Promise<void>;
  /** Of these reservation ids, the ones whose lifecycle workflow is running now (visibility may lag). */
  running(reservationIds: string[]): Promise<Set<string>>;
  signal(reservationId: string, signal: LifecycleSignal): Promise<void>;
  /** Wakes every pending reservation of a pool at once (a release freed capacity). */
  wakePool(poolId: string): Promise<void>;
  /**
   * Moves the lease to now + leaseSeconds through the workflow's `renew` update and answers the new
   * deadline; INVALID_STATE in a terminal state or without a lease (the update's validator).
   */
  renew?(reservationId: string): Promise<{ leaseExpiresAt: Date }>;
  /**
   * Starts a spot preemption's workflow after the placement that preempted committed (harmless
   * twice: its id is the preemption's; answers false when it was already running). Should it never
   * start, the orphan sweeper starts it, and each noticed spot reservation's own lifecycle releases
   * it a minute after the deadline.
   */
  preempt?(preemption: PreemptionSummary): Promise<boolean | undefined>;
  /** Wakes a spot preemption's workflow (its notice was called off, or it should look again now). */
  wakePreemption?(preemptionId: string): Promise<void>;
  /**
   * Wakes a provisioning workflow (what its step waits on was stored: the command's result, the
   * machine's agent joined again). One already over has nothing to wake.
   */
  wakeMetalWorkflow?(workflowId: string): Promise<void>;
}

/**
 * The typed bag of dependencies passed explicitly to every factory (no singletons).
 * `temporal` and `lifecycle` are absent in processes that never start or signal workflows.
 */
export interface Deps {
  config: Config;
  db: Db;
  log: Logger;
  iam: IamPort;
  temporal?: Client;
  lifecycle?: ReservationLifecycle;
  /** Admission's short-lived caches, one set per process (createCompute makes one when absent). */
  caches?: AdmissionCaches;
}
