import { z } from 'zod';
import { tenantIdSchema } from './reservation-schema.ts';

/**
 * Host holds, the pure part: what a workload kind declares, how a holder is named, how a host's
 * capacity publication is judged against a kind, and the exact sentences of every refusal (those
 * of Stado's host reservations, with the pool's kinds in place of workloads.json).
 */

/** The holder heartbeats this often by default. */
export const holdHeartbeatSeconds = 60;
/** Three heartbeats: one missed is a slow store, three is a holder that is gone. */
export const defaultHoldTtlSeconds = 3 * holdHeartbeatSeconds;
/** Released and expired holds stay visible this long, marked as ended. */
export const endedHoldVisibleMs = 3_600_000;
/** Below one core or one GiB net, a host takes no new work (`reservations_exhausted`). */
export const exhaustedBelow = { cpuCores: 1, ramGiB: 1 } as const;

export const holdKindNameSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, 'a kind name is 1 to 63 lower-case letters, digits, ".", "_" or "-"');

const poolRef = z.string().min(1).max(100);
/** A node id or name. */
const targetSchema = z.string().min(1).max(200);
const gib = z.number().min(0).max(1_000_000);

export const setHoldKindInput = z.strictObject({
  tenantId: tenantIdSchema,
  /** The pool (id or name) the tenant owns. */
  pool: poolRef,
  name: holdKindNameSchema,
  cpuCores: z.number().min(0).max(10_000),
  ramGiB: gib,
  vramGiB: gib.default(0),
  /** The default TTL of its holds (default three heartbeats, 180 s). */
  ttlSeconds: z.number().int().min(3).max(86_400).optional(),
});

export const listHoldKindsInput = z.strictObject({ tenantId: tenantIdSchema, pool: poolRef.optional() });

export const holdKindSchema = z.object({
  poolId: z.string(),
  name: z.string(),
  cpuCores: z.number(),
  ramGiB: z.number(),
  vramGiB: z.number(),
  ttlSeconds: z.number().nullable(),
});
export type HoldKind = z.infer<typeof holdKindSchema>;

export const createHoldInput = z.strictObject({
  tenantId: tenantIdSchema,
  /** The node: its id or name. */
  target: targetSchema,
  kind: holdKindNameSchema,
  /** The same key answers the same hold (and a refusal is recorded once). */
  idempotencyKey: z
    .string()
    .regex(/^[A-Za-z0-9._:-]{1,128}$/)
    .optional(),
  /** What the holder adds to its name: the path that places the work and its process id. */
  path: z
    .string()
    .regex(/^[\x21-\x7e]([\x20-\x7e]{0,118}[\x21-\x7e])?$/)
    .optional(),
  pid: z.number().int().min(0).max(4_294_967_295).optional(),
  /** Overrides the kind's TTL (at least one second more than the heartbeat interval you use). */
  ttlSeconds: z.number().int().min(3).max(86_400).optional(),
});

export const holdRefSchema = z.strictObject({ tenantId: tenantIdSchema, holdId: z.string().min(1).max(100) });

export const listHoldsInput = z.strictObject({
  tenantId: tenantIdSchema,
  /** Only the holds on this node (id or name). */
  target: targetSchema.optional(),
  /** Also the holds that ended within the last hour (default true). */
  includeEnded: z.boolean().default(true),
});

export const holdStates = ['live', 'released', 'expired'] as const;
export type HoldState = (typeof holdStates)[number];

export const holdViewSchema = z.object({
  id: z.string(),
  tenantId: z.string(),
  poolId: z.string(),
  nodeId: z.string(),
  target: z.string(),
  kind: z.string(),
  holder: z.string(),
  cpuCores: z.number(),
  ramGiB: z.number(),
  vramGiB: z.number(),
  ttlSeconds: z.number(),
  state: z.enum(holdStates),
  /** Whether it was taken on trust (the host had no fresh publication to judge it by). */
  onTrust: z.boolean(),
  acquiredAt: z.number(),
  heartbeatAt: z.number(),
  /** heartbeatAt + ttlSeconds, or the release. */
  expiresAt: z.number(),
  endedAt: z.number().nullable(),
});
export type HoldView = z.infer<typeof holdViewSchema>;

/** Three figures of a host, each null when never reported. */
export interface HostFigures {
  cpuCores: number | null;
  ramGiB: number | null;
  vramGiB: number | null;
}

/** What a host publishes, net of every live hold and reservation (the one reading of holds). */
export interface HostPublication {
  nodeId: string;
  name: string;
  poolId: string | null;
  /** The host has a fresh publication (its session is connected); otherwise it is taken on trust. */
  fresh: boolean;
  /** Why its scheduling state takes no work (cordoned, draining…), before any figure. */
  schedulingRefusals: string[];
  /** What the host reported as allocatable (VRAM: of its healthy GPUs). */
  total: HostFigures;
  /** What the bookings of reservations leave now, before holds (the host's own measure). */
  measured: HostFigures;
  /** Net of every live hold and reservation: what a new hold or placement can take. */
  available: HostFigures;
  /** What the live holds take. */
  reserved: { cpuCores: number; ramGiB: number; vramGiB: number };
  /** Live holds on the host. */
  runningWorkloads: number;
  /** Live reservations booking host resources on it now. */
  runningReservations: number;
  acceptingJobs: boolean;
  admissionReason: string | null;
  publishedAt: number | null;
  ageSeconds: number | null;
}

/**
 * Whether a host left with `available` takes new work: not below one core or one GiB. A figure
 * never reported does not exhaust anything.
 */
export function exhaustionOf(
  available: Pick<HostFigures, 'cpuCores' | 'ramGiB'>,
): 'reservations_exhausted' | null {
  const low =
    (available.cpuCores !== null && available.cpuCores < exhaustedBelow.cpuCores) ||
    (available.ramGiB !== null && available.ramGiB < exhaustedBelow.ramGiB);
  return low ? 'reservations_exhausted' : null;
}

/**
 * The holder's name: `<identity>@<tenant>`, then the path and pid the caller adds. Null when the
 * identity has no name to give (the hold is then refused, never taken under a made-up name).
 */
export function holderName(
  identity: { name: string | null | undefined; tenantId: string },
  extra: { path?: string | undefined; pid?: number | undefined },
): string | null {
  const name = identity.name?.trim();
  if (!name) return null;
  return [
    `${name}@${identity.tenantId}`,
    extra.path,
    extra.pid !== undefined ? `pid ${extra.pid}` : undefined,
  ]
    .filter((part) => part !== undefined && part !== '')
    .join(' ');
}

export const holdRefusalReasons = ['no-kind', 'not-accepting', 'no-field', 'no-room'] as const;
export type HoldRefusalReason = (typeof holdRefusalReasons)[number];

export interface HoldRefusal {
  reason: HoldRefusalReason;
  message: string;
  details: Record<string, unknown>;
}

/** How a figure prints in a sentence: the number, or `not reported`. */
export const figure = (value: number | null | undefined) =>
  value === null || value === undefined ? 'not reported' : String(Number(value.toFixed(3)));

/** `workload kind '<KIND>' declares no reservation; declare it with holds.kinds.set` */
export function noKindRefusal(kind: string, poolId: string | null): HoldRefusal {
  return {
    reason: 'no-kind',
    message: `workload kind '${kind}' declares no reservation; declare it with holds.kinds.set`,
    details: { kind, poolId },
  };
}

/**
 * Judges a kind against a host's fresh publication, as the seed orders it: a host that is not
 * accepting placements, one that publishes no CPU figure, one whose net room is below the kind's
 * declaration; null when the hold fits. Pure.
 */
export function judgeHold(
  target: string,
  kind: Pick<HoldKind, 'name' | 'cpuCores' | 'ramGiB' | 'vramGiB'>,
  publication: HostPublication,
): HoldRefusal | null {
  const figures = {
    target,
    nodeId: publication.nodeId,
    kind: kind.name,
    needs: { cpuCores: kind.cpuCores, ramGiB: kind.ramGiB, vramGiB: kind.vramGiB },
    publishes: publication.available,
    measured: publication.measured,
    holds: publication.runningWorkloads,
    reservations: publication.runningReservations,
  };
  const notAccepting = publication.schedulingRefusals[0] ?? publication.admissionReason;
  if (!publication.acceptingJobs || notAccepting) {
    const reason = notAccepting ?? 'not accepting';
    return {
      reason: 'not-accepting',
      message: `${target} is not accepting placements (${reason}); pick another host with --target or wait for it to clear`,
      details: { ...figures, admissionReason: reason },
    };
  }
  const a = publication.available;
  if (a.cpuCores === null) {
    return {
      reason: 'no-field',
      message: `${target} publishes no availableCpuCores in its capacity row, so whether the hold fits cannot be judged; update its agent or pick another host with --target`,
      details: { ...figures, field: 'availableCpuCores' },
    };
  }
  const short =
    a.cpuCores < kind.cpuCores ||
    (a.ramGiB !== null && a.ramGiB < kind.ramGiB) ||
    (kind.vramGiB > 0 && (a.vramGiB ?? 0) < kind.vramGiB);
  if (!short) return null;
  return noRoomRefusal(target, kind, publication, figures);
}

function noRoomRefusal(
  target: string,
  kind: Pick<HoldKind, 'name' | 'cpuCores' | 'ramGiB' | 'vramGiB'>,
  publication: HostPublication,
  figures: Record<string, unknown>,
): HoldRefusal {
  const a = publication.available;
  const count = publication.runningWorkloads + publication.runningReservations;
  return {
    reason: 'no-room',
    message:
      `${target} has no room for ${kind.name}: needs ${figure(kind.cpuCores)} cores and ${figure(kind.ramGiB)} GiB, ` +
      `host publishes ${figure(a.cpuCores)} cores and ${figure(a.ramGiB)} GiB net of ${count} reservation(s); ` +
      'pick another host with --target or wait for a reservation to end',
    details: figures,
  };
}

/**
 * The no-room refusal for a hold the booking guard refused after the judgement (a concurrent
 * reservation or hold took the room first), from the publication read again afterwards.
 */
export function lostRaceRefusal(
  target: string,
  kind: Pick<HoldKind, 'name' | 'cpuCores' | 'ramGiB' | 'vramGiB'>,
  publication: HostPublication,
): HoldRefusal {
  return (
    judgeHold(target, kind, publication) ??
    noRoomRefusal(target, kind, publication, {
      target,
      nodeId: publication.nodeId,
      kind: kind.name,
      needs: { cpuCores: kind.cpuCores, ramGiB: kind.ramGiB, vramGiB: kind.vramGiB },
      publishes: publication.available,
    })
  );
}

/** The state of a hold at `now`. */
export function holdStateAt(
  hold: { releasedAt: number | null; heartbeatAt: number; ttlSeconds: number },
  now: number,
): HoldState {
  if (hold.releasedAt !== null) return 'released';
  return hold.heartbeatAt + hold.ttlSeconds * 1000 > now ? 'live' : 'expired';
}
