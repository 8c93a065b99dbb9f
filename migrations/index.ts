import type { Migration, MigrationProvider } from 'kysely';
import * as clock from './2026-11-29T00-clock.ts';
import * as fleet from './2026-11-29T01-fleet.ts';
import * as bookings from './2026-11-29T02-bookings.ts';
import * as records from './2026-11-29T03-records.ts';
import * as trustAndLifecycle from './2026-11-29T04-trust-and-lifecycle.ts';
import * as iam from './2026-11-29T10-iam.ts';
import * as placementIndexes from './2026-11-29T11-placement-indexes.ts';
import * as allocationRecency from './2026-11-29T12-allocation-recency.ts';
import * as gateway from './2026-11-29T20-gateway.ts';
import * as lifecycle from './2026-11-29T30-lifecycle.ts';
import * as allocationLifecycle from './2026-11-29T31-allocation-lifecycle.ts';
import * as eventsAndWebhooks from './2026-11-29T40-events-and-webhooks.ts';
import * as admissionHardening from './2026-11-29T55-admission-hardening.ts';
import * as nodeTrust from './2026-11-29T60-node-trust.ts';
import * as hostHolds from './2026-11-30T10-host-holds.ts';
import * as gang from './2026-11-30T20-gang.ts';
import * as calendar from './2026-11-30T21-calendar.ts';
import * as poolAdministration from './2026-11-30T23-pool-administration.ts';
import * as releasesRollouts from './2026-11-30T50-releases-rollouts.ts';
import * as nodeEnforcement from './2026-11-30T60-node-enforcement.ts';
import * as bareMetal from './2026-11-30T70-bare-metal.ts';
import * as taintsDrains from './2026-11-30T81-taints-drains.ts';
import * as poolLease from './2026-11-30T82-pool-lease.ts';
import * as deviceBookingGuard from './2026-12-01T00-device-booking-guard.ts';
import * as statementAbort from './2026-12-01T01-statement-abort.ts';
import * as clockPlpgsql from './2026-12-01T02-clock-plpgsql.ts';
import * as hostBookingIndex from './2026-12-01T03-host-booking-index.ts';
import * as lifecycleWakes from './2026-12-01T04-lifecycle-wakes.ts';
import * as hostBookingEndIndex from './2026-12-03T00-host-booking-end-index.ts';
import * as dropAllocationRecencyIndex from './2026-12-05T00-drop-allocation-recency-index.ts';
import * as joinTokenUses from './2026-12-06T00-join-token-uses.ts';
import * as outboxHorizon from './2026-12-06T01-outbox-horizon.ts';
import * as queueAndLiveIndexes from './2026-12-07T00-queue-and-live-indexes.ts';
import * as scalarGuardPerStatement from './2026-12-07T01-scalar-guard-per-statement.ts';

/** Every migration in order; names are frozen once released. */
export const migrations: Record<string, Migration> = {
  '2026-11-29T00-clock': clock,
  '2026-11-29T01-fleet': fleet,
  '2026-11-29T02-bookings': bookings,
  '2026-11-29T03-records': records,
  '2026-11-29T04-trust-and-lifecycle': trustAndLifecycle,
  '2026-11-29T10-iam': iam,
  '2026-11-29T11-placement-indexes': placementIndexes,
  '2026-11-29T12-allocation-recency': allocationRecency,
  '2026-11-29T20-gateway': gateway,
  '2026-11-29T30-lifecycle': lifecycle,
  '2026-11-29T31-allocation-lifecycle': allocationLifecycle,
  '2026-11-29T40-events-and-webhooks': eventsAndWebhooks,
  '2026-11-29T55-admission-hardening': admissionHardening,
  '2026-11-29T60-node-trust': nodeTrust,
  '2026-11-30T10-host-holds': hostHolds,
  '2026-11-30T20-gang': gang,
  '2026-11-30T21-calendar': calendar,
  '2026-11-30T23-pool-administration': poolAdministration,
  '2026-11-30T50-releases-rollouts': releasesRollouts,
  '2026-11-30T60-node-enforcement': nodeEnforcement,
  '2026-11-30T70-bare-metal': bareMetal,
  '2026-11-30T81-taints-drains': taintsDrains,
  '2026-11-30T82-pool-lease': poolLease,
  '2026-12-01T00-device-booking-guard': deviceBookingGuard,
  '2026-12-01T01-statement-abort': statementAbort,
  '2026-12-01T02-clock-plpgsql': clockPlpgsql,
  '2026-12-01T03-host-booking-index': hostBookingIndex,
  '2026-12-01T04-lifecycle-wakes': lifecycleWakes,
  '2026-12-03T00-host-booking-end-index': hostBookingEndIndex,
  '2026-12-05T00-drop-allocation-recency-index': dropAllocationRecencyIndex,
  '2026-12-06T00-join-token-uses': joinTokenUses,
  '2026-12-06T01-outbox-horizon': outboxHorizon,
  '2026-12-07T00-queue-and-live-indexes': queueAndLiveIndexes,
  '2026-12-07T01-scalar-guard-per-statement': scalarGuardPerStatement,
};

export const migrationProvider: MigrationProvider = {
  getMigrations: async () => migrations,
};
