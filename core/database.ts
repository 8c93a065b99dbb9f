import type { ColumnType, Generated, Insertable, Kysely, Selectable, Updateable } from 'kysely';
import type {
  AllocationState,
  CommandLane,
  CommandState,
  Connectivity,
  DeviceClass,
  HostResource,
  NodeRole,
  PoolClass,
  PoolSharingMode,
  ProvisionState,
} from '../domain/fleet.ts';
import type { ReservationState } from '../domain/reservation-states.ts';
import type { Sealed } from '../domain/sealing.ts';

/** Timestamps read as Date, written as Date or an SQL expression. */
type Timestamp = ColumnType<Date, Date | string, Date | string>;
type TimestampDefault = ColumnType<Date, Date | string | undefined, Date | string>;
/** A PostgreSQL range (`tstzrange`) in its text form, e.g. `["2026-01-01 00:00:00+00","…")`. */
type Range = string;
/** numeric comes back from pg as a string to keep precision. */
type Numeric = ColumnType<string, number | string, number | string>;
type Json<T = unknown> = ColumnType<T, string, string>;

export interface ComputeClockTable {
  singleton: Generated<boolean>;
  frozen_at: Timestamp | null;
  offset_by: Generated<string>;
}

export interface SitesTable {
  id: string;
  name: string;
  region: string;
  kind: Generated<'shared' | 'dedicated' | 'custom'>;
  owner_tenant_id: string | null;
  created_at: TimestampDefault;
}

export interface PoolsTable {
  id: string;
  site_id: string;
  owner_tenant_id: string;
  name: string;
  gpu_model: string;
  class: Generated<PoolClass>;
  sharing_mode: Generated<PoolSharingMode>;
  policy: Json<Record<string, unknown>>;
  /** Raised by every policy change (admin.setPoolPolicy); each version is an audit row. */
  policy_version: Generated<number>;
  archived_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface PoolOffersTable {
  pool_id: string;
  tenant_id: string;
  priority: Generated<number>;
  on_budget_exceeded: Generated<'allow' | 'stop-new' | 'drain'>;
  created_at: TimestampDefault;
}

export interface QuotasTable {
  tenant_id: string;
  pool_id: string;
  resource: string;
  limit_amount: Numeric;
  used: ColumnType<string, number | string | undefined, number | string>;
}

export interface QuotaChargesTable {
  reservation_id: string;
  tenant_id: string;
  pool_id: string;
  resource: string;
  amount: Numeric;
  charged_at: TimestampDefault;
  refunded_at: Timestamp | null;
}

export interface ProjectsTable {
  id: string;
  tenant_id: string;
  name: string;
  created_at: TimestampDefault;
}

export interface NodesTable {
  id: string;
  site_id: string;
  pool_id: string | null;
  name: string;
  role: Generated<NodeRole>;
  provision_state: Generated<ProvisionState>;
  cordoned: Generated<boolean>;
  cordon_reason: string | null;
  draining: Generated<boolean>;
  /** When a drain finished (the node's last allocation ended); null while draining or not draining. */
  drained_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  maintenance: Generated<boolean>;
  maintenance_reason: string | null;
  power_state: Generated<'on' | 'off' | 'unknown'>;
  connectivity: Generated<Connectivity>;
  epoch: ColumnType<string, number | string | undefined, number | string>;
  session_gateway: string | null;
  last_heartbeat_at: Timestamp | null;
  agent_version: string | null;
  capabilities: ColumnType<string[], string[] | undefined, string[]>;
  journal_id: string | null;
  spec: Json<Record<string, unknown>>;
  spec_generation: ColumnType<string, number | string | undefined, number | string>;
  observed_generation: ColumnType<string | null, number | string | null | undefined, number | string | null>;
  next_command_seq: ColumnType<string, number | string | undefined, number | string>;
  hardware_key: string | null;
  installed_release_id: string | null;
  /** An operator's nodes.approveReclaim: until then a join may reclaim the node without proof. */
  reclaim_approved_until: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface NodeLabelsTable {
  node_id: string;
  key: string;
  value: string;
  source: 'system' | 'inventory' | 'operator';
}

export interface NodeConditionsTable {
  node_id: string;
  type: string;
  reason: string;
  message: Generated<string>;
  effect: 'NoSchedule' | null;
  since: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface DeviceAttributes {
  model?: string;
  memoryMiB?: number;
  nvlinkDomain?: string;
  numaNode?: number;
  [key: string]: unknown;
}

export interface DevicesTable {
  id: string;
  node_id: string;
  class: DeviceClass;
  stable_id: string;
  parent_id: string | null;
  bookable: Generated<boolean>;
  health: Generated<'healthy' | 'unhealthy' | 'unknown'>;
  attributes: Json<DeviceAttributes>;
  removed_at: Timestamp | null;
  created_at: TimestampDefault;
  /** The NodeSpec generation the node must have converged before this atom may be booked. */
  bookable_from_generation: Generated<string>;
}

export interface HostResourcesTable {
  node_id: string;
  resource: HostResource;
  capacity: Numeric;
  allocatable: Numeric;
}

export interface InventorySnapshotsTable {
  id: Generated<string>;
  node_id: string;
  section: string;
  hash: string;
  data: Json;
  received_at: TimestampDefault;
}

export { type ReservationState, reservationStates } from '../domain/reservation-states.ts';

/** A wake a caller's release or cancel owes the reservation's lifecycle (migration 2026-12-01T04). */
export interface LifecycleWakesTable {
  reservation_id: string;
  reason: string;
  created_at: Generated<Date>;
}

export interface ReservationsTable {
  id: string;
  tenant_id: string;
  pool_id: string;
  owner_identity_id: string;
  idempotency_key: string;
  request: Json<Record<string, unknown>>;
  request_hash: string;
  state: ReservationState;
  requested_start: Timestamp | null;
  duration_ms: ColumnType<string, number | string, number | string>;
  during: Range | null;
  gang_size: Generated<number>;
  /** The topology label value a gang's members share (migration 2026-11-30T20-gang). */
  gang_topology_value: Generated<string | null>;
  binding_kind: Generated<'hold' | 'kubernetes' | 'node' | 'instance'>;
  spot: Generated<boolean>;
  preempt_notice_until: Timestamp | null;
  lease_seconds: number | null;
  lease_expires_at: Timestamp | null;
  project_id: string | null;
  host_share: Json<Record<string, number>> | null;
  conditions: ColumnType<unknown[], string | undefined, string>;
  bind_attempts: Generated<number>;
  pending_since: Timestamp | null;
  confirmation_id: string | null;
  confirmation_expires_at: Timestamp | null;
  admission_context: Json<Record<string, unknown>> | null;
  end_reason: string | null;
  lifecycle_started_at: Timestamp | null;
  /** The deadline of the current binding attempt (migration T30). */
  bind_deadline: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  version: Generated<number>;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface AllocationsTable {
  id: string;
  reservation_id: string | null;
  instance_id: string | null;
  node_id: string;
  gang_index: Generated<number>;
  /** How often this gang member was re-placed on its own (migration 2026-11-30T20-gang). */
  member_attempt: Generated<number>;
  state: AllocationState;
  during: Range;
  resources: Json<Record<string, number>>;
  binding: Json<Record<string, unknown>> | null;
  attested: Generated<boolean>;
  bound_report: Buffer | null;
  bound_sig_kid: string | null;
  bound_sig: Buffer | null;
  bound_at: Timestamp | null;
  released_at: Timestamp | null;
  /** Set when the control plane ends the allocation (migration T31); null = current placement. */
  superseded_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  /** Set when a later report of a bound allocation failed verification (migration T31). */
  binding_lost_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface DeviceBookingsTable {
  device_id: string;
  allocation_id: string;
  during: Range;
}

export interface ScalarBookingsTable {
  allocation_id: string;
  node_id: string;
  resource: HostResource;
  amount: Numeric;
  during: Range;
}

export interface ExtendHoldsTable {
  reservation_id: string;
  hold: string;
  taken_at: TimestampDefault;
}

export interface UsageWindowsTable {
  allocation_id: string;
  hour_start: Timestamp;
  meter: string;
  tenant_id: string;
  reservation_id: string | null;
  quantity: Numeric;
  idempotency_key: string;
  recorded_at: TimestampDefault;
  sent_at: Timestamp | null;
}

export interface InstancesTable {
  id: string;
  tenant_id: string;
  pool_id: string;
  flavor: string;
  desired_state: 'running' | 'stopped' | 'deleted';
  state: string;
  spec: Json;
  version: Generated<number>;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface AuthzProjectionTable {
  resource_type: string;
  resource_id: string;
  tenant_id: string;
  parent_type: string | null;
  parent_id: string | null;
  owner_identity_id: string | null;
  attributes: Json<Record<string, unknown>>;
  pending: Json<Record<string, unknown>> | null;
  updated_at: TimestampDefault;
}

export interface AuditEventsTable {
  id: Generated<string>;
  at: TimestampDefault;
  tenant_id: string | null;
  actor_identity_id: string | null;
  action: string;
  resource_type: string;
  resource_id: string;
  outcome: Generated<string>;
  request_id: string | null;
  context: Json<Record<string, unknown>>;
}

export interface OutboxEventsTable {
  seq: Generated<string>;
  id: string;
  type: string;
  subject: string;
  tenant_id: string | null;
  data: Json<Record<string, unknown>>;
  created_at: TimestampDefault;
}

export interface NodeCommandsTable {
  id: string;
  node_id: string;
  seq: ColumnType<string, number | string, number | string>;
  kind: string;
  lane: CommandLane;
  payload: Json<Record<string, unknown>>;
  not_before: Timestamp | null;
  not_after: Timestamp | null;
  min_generation: ColumnType<string | null, number | string | null | undefined, number | string | null>;
  state: Generated<CommandState>;
  journal_id: string | null;
  result: Json<Record<string, unknown>> | null;
  error: string | null;
  created_at: TimestampDefault;
  delivered_at: Timestamp | null;
  completed_at: Timestamp | null;
}

export interface JoinTokensTable {
  id: string;
  pool_id: string;
  secret_hash: string;
  expires_at: Timestamp;
  max_uses: Generated<number>;
  uses: Generated<number>;
  revoked_at: Timestamp | null;
  created_by: string | null;
  created_at: TimestampDefault;
}

/** One use of a join token: the node that joined with it. Its insert spends the use at commit. */
export interface JoinTokenUsesTable {
  id: Generated<string>;
  token_id: string;
  node_id: string;
  used_at: TimestampDefault;
}

export interface CertificateAuthoritiesTable {
  name: string;
  trust_domain: string;
  certificate_pem: string;
  /** Sealed (domain/sealing.ts) and written only sealed; a key stored before sealing reads as PEM until the gateway seals it. */
  private_key_pem: ColumnType<string, Sealed<'ca-key'>, Sealed<'ca-key'>>;
  created_at: TimestampDefault;
}

export interface NodeCertificatesTable {
  serial: string;
  node_id: string;
  role: NodeRole;
  spiffe_id: string;
  key_id: string;
  public_key_pem: string;
  certificate_pem: string;
  not_before: Timestamp;
  not_after: Timestamp;
  revoked_at: Timestamp | null;
  /** Why it was revoked; null on a revoked row: for cause. */
  revoke_reason: ColumnType<
    CertificateRevokeReason | null,
    CertificateRevokeReason | null | undefined,
    CertificateRevokeReason | null
  >;
  created_at: TimestampDefault;
}

/**
 * `superseded`: a renewal or a proved reclaim replaced it (the same machine holds the successor);
 * `reclaimed`: an operator-approved reclaim; `retired`: nodes.retire; `revoked`: an operator's
 * nodes.revokeCertificates.
 */
export type CertificateRevokeReason = 'superseded' | 'reclaimed' | 'retired' | 'revoked';

/** A handle on the compute database (a pool or a transaction's connection). */
export type Db = Kysely<Database>;

/** The compute schema (public). IAM's tables live in their own schema and their own interface. */
export interface Database {
  compute_clock: ComputeClockTable;
  sites: SitesTable;
  pools: PoolsTable;
  pool_offers: PoolOffersTable;
  quotas: QuotasTable;
  quota_charges: QuotaChargesTable;
  projects: ProjectsTable;
  nodes: NodesTable;
  node_labels: NodeLabelsTable;
  node_conditions: NodeConditionsTable;
  devices: DevicesTable;
  host_resources: HostResourcesTable;
  inventory_snapshots: InventorySnapshotsTable;
  reservations: ReservationsTable;
  lifecycle_wakes: LifecycleWakesTable;
  allocations: AllocationsTable;
  device_bookings: DeviceBookingsTable;
  scalar_bookings: ScalarBookingsTable;
  extend_holds: ExtendHoldsTable;
  usage_windows: UsageWindowsTable;
  instances: InstancesTable;
  authz_projection: AuthzProjectionTable;
  audit_events: AuditEventsTable;
  outbox_events: OutboxEventsTable;
  node_commands: NodeCommandsTable;
  join_tokens: JoinTokensTable;
  join_token_uses: JoinTokenUsesTable;
  certificate_authorities: CertificateAuthoritiesTable;
  node_certificates: NodeCertificatesTable;
}

export type Reservation = Selectable<ReservationsTable>;
export type NewReservation = Insertable<ReservationsTable>;
export type ReservationUpdate = Updateable<ReservationsTable>;
export type Node = Selectable<NodesTable>;
export type Device = Selectable<DevicesTable>;
export type Allocation = Selectable<AllocationsTable>;
export type Pool = Selectable<PoolsTable>;

/** Every attested report a node sent about one of its allocations, as received (the gateway). */
export interface AllocationReportsTable {
  id: Generated<string>;
  allocation_id: string;
  node_id: string;
  kind: 'bound' | 'failed' | 'released';
  epoch: ColumnType<string, number | string, number | string>;
  report: Buffer;
  sig_kid: string | null;
  sig: Buffer | null;
  received_at: TimestampDefault;
}

export interface Database {
  allocation_reports: AllocationReportsTable;
  webhook_subscriptions: WebhookSubscriptionsTable;
  webhook_deliveries: WebhookDeliveriesTable;
}

/** One webhook endpoint of a tenant (migration 2026-11-29T40-events-and-webhooks). */
export interface WebhookSubscriptionsTable {
  id: string;
  tenant_id: string;
  url: string;
  /** The signing secret, sealed and written only sealed; one stored before sealing reads as plaintext until sealed. */
  secret: ColumnType<string, Sealed<'webhook-secret'>, Sealed<'webhook-secret'>>;
  event_types: ColumnType<string[], string[] | undefined, string[]>;
  description: Generated<string>;
  created_by: string | null;
  /** xid8 as text. */
  cursor_xid: ColumnType<string, string | undefined, string>;
  cursor_seq: ColumnType<string, string | number | undefined, string | number>;
  attempts: Generated<number>;
  next_attempt_at: Timestamp | null;
  lease_owner: string | null;
  lease_until: Timestamp | null;
  deleted_at: Timestamp | null;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

/** Every delivery attempt of an event to a webhook. */
export interface WebhookDeliveriesTable {
  id: string;
  subscription_id: string;
  event_id: string;
  event_seq: ColumnType<string, string | number, string | number>;
  event_type: string;
  attempt: number;
  outcome: 'succeeded' | 'retrying' | 'failed';
  status_code: number | null;
  error: string | null;
  duration_ms: number;
  created_at: TimestampDefault;
}

/** One extend that moved a reservation's end, by its key (migration 2026-11-29T55-admission-hardening). */
export interface ReservationExtendsTable {
  reservation_id: string;
  actor_identity_id: string;
  idempotency_key: string;
  request_hash: string;
  previous_end: Timestamp;
  new_end: Timestamp;
  created_at: TimestampDefault;
}

export interface Database {
  reservation_extends: ReservationExtendsTable;
}

/** One BookingRepair that moved members or found no place for them (migration 2026-11-30T21-calendar). */
export interface ReservationRepairsTable {
  id: Generated<string>;
  reservation_id: string;
  moment: 'pre-start' | 'start';
  outcome: 'repaired' | 'failed';
  moves: Json<unknown[]>;
  message: string | null;
  workflow_id: string | null;
  created_at: TimestampDefault;
}

export interface Database {
  reservation_repairs: ReservationRepairsTable;
}

/** A site agent's join token `bcst_<id>.<secret>` (migration 2026-11-30T70-bare-metal). */
export interface SiteJoinTokensTable {
  id: string;
  site_id: string;
  secret_hash: string;
  expires_at: Timestamp;
  max_uses: Generated<number>;
  uses: Generated<number>;
  revoked_at: Timestamp | null;
  created_by: string | null;
  created_at: TimestampDefault;
}

/** The `site:<id>:boot` lease: one holder, an epoch that grows with each new tenure. */
export interface SiteBootLeasesTable {
  site_id: string;
  holder_node_id: string;
  epoch: ColumnType<string, number | string, number | string>;
  acquired_at: TimestampDefault;
  renewed_at: TimestampDefault;
  expires_at: Timestamp;
}

/** The BMC of a bare machine; the password is written only sealed. */
export interface BmcEndpointsTable {
  node_id: string;
  site_id: string;
  address: string;
  system_id: string;
  username: string;
  password_sealed: ColumnType<string, Sealed<'bmc-credential'>, Sealed<'bmc-credential'>>;
  power_state: 'on' | 'off' | 'unknown' | null;
  boot_device: string | null;
  last_error: string | null;
  observed_at: Timestamp | null;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

export interface ImagesTable {
  id: string;
  tenant_id: string;
  name: string;
  version: string;
  format: 'raw' | 'qcow2' | 'iso';
  sha256: string;
  url: string;
  size_bytes: ColumnType<string | null, number | string | null, number | string | null>;
  signature: string | null;
  signer_pin: string | null;
  verified: boolean;
  created_at: TimestampDefault;
}

export interface ProfilesTable {
  id: string;
  version: number;
  tenant_id: string;
  name: string;
  image_id: string | null;
  spec: Json<Record<string, unknown>>;
  used_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface MetalWorkflowsTable {
  id: string;
  kind: Generated<'deploy' | 'inspect' | 'clean'>;
  node_id: string;
  site_id: string;
  tenant_id: string;
  profile_id: string | null;
  profile_version: number | null;
  state: 'running' | 'succeeded' | 'failed' | 'aborted';
  phase: Generated<'main' | 'cleanup'>;
  idempotency_key: string | null;
  reason: string | null;
  abort_requested: string | null;
  allocation_id: string | null;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
  finished_at: Timestamp | null;
}

export interface MetalWorkflowStepsTable {
  workflow_id: string;
  idx: number;
  phase: 'main' | 'cleanup';
  name: string;
  target: 'control-plane' | 'site' | 'node' | 'ramdisk';
  action: Json<Record<string, unknown>>;
  await_rejoin: Generated<boolean>;
  timeout_seconds: number;
  max_attempts: number;
  state: Generated<'pending' | 'running' | 'succeeded' | 'failed' | 'skipped'>;
  attempts: ColumnType<Array<Record<string, unknown>>, string | undefined, string>;
  error: string | null;
  started_at: Timestamp | null;
  finished_at: Timestamp | null;
}

export interface DiscoveryTokensTable {
  id: string;
  node_id: string;
  role: 'ramdisk' | 'node';
  site_id: string;
  workflow_id: string | null;
  secret_hash: string;
  expires_at: Timestamp;
  used_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface Database {
  discovery_tokens: DiscoveryTokensTable;
  site_join_tokens: SiteJoinTokensTable;
  site_boot_leases: SiteBootLeasesTable;
  bmc_endpoints: BmcEndpointsTable;
  images: ImagesTable;
  profiles: ProfilesTable;
  metal_workflows: MetalWorkflowsTable;
  metal_workflow_steps: MetalWorkflowStepsTable;
}

/** A workload kind a pool declares: what one hold of it takes on a host (migration 2026-11-30T10-host-holds). */
export interface HoldKindsTable {
  pool_id: string;
  name: string;
  cpu_cores: Numeric;
  ram_gib: Numeric;
  vram_gib: Numeric;
  ttl_seconds: number | null;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

/** A hold a placed workload keeps on its host; live while heartbeat_at + ttl_seconds is ahead. */
export interface HostHoldsTable {
  id: string;
  tenant_id: string;
  pool_id: string;
  node_id: string;
  kind: string;
  holder: string;
  owner_identity_id: string;
  idempotency_key: string | null;
  cpu_cores: Numeric;
  ram_gib: Numeric;
  vram_gib: Numeric;
  ttl_seconds: number;
  on_trust: Generated<boolean>;
  acquired_at: TimestampDefault;
  heartbeat_at: TimestampDefault;
  released_at: Timestamp | null;
}

/** A hold's scalar booking, refereed with scalar_bookings by one guard. */
export interface HoldBookingsTable {
  hold_id: string;
  node_id: string;
  resource: HostResource;
  amount: Numeric;
  during: Range;
}

/** One unmet request (a refused hold, a pending or refused reservation), once per dedupe key. */
export interface UnmetDemandTable {
  id: Generated<string>;
  dedupe_key: string;
  tenant_id: string;
  pool_id: string | null;
  source: 'hold' | 'reservation';
  subject_id: string | null;
  shape: string;
  kind: string | null;
  device_request: Json<unknown> | null;
  reason: string;
  message: string;
  recorded_at: TimestampDefault;
}

export interface Database {
  hold_kinds: HoldKindsTable;
  host_holds: HostHoldsTable;
  hold_bookings: HoldBookingsTable;
  unmet_demand: UnmetDemandTable;
}

/** A signed bcd release (migration 2026-11-30T50-releases-rollouts). */
export interface ReleasesTable {
  id: string;
  channel: string;
  version: string;
  protocol_version: number;
  min_control_plane_version: string;
  manifest: Json<Record<string, unknown>>;
  manifest_digest: string;
  signatures: Json<Array<Record<string, unknown>>>;
  signer_pins: ColumnType<string[], string[], string[]>;
  expires_at: Timestamp;
  published_by: string | null;
  created_at: TimestampDefault;
}

export interface ReleaseFilesTable {
  release_id: string;
  path: string;
  size: number;
  sha256: string;
  content: Buffer;
}

export interface RolloutsTable {
  id: string;
  release_id: string;
  created_by: string;
  idempotency_key: string;
  request_hash: string;
  selector: Json<Record<string, unknown>>;
  waves: Json<number[]>;
  state: Generated<'running' | 'paused' | 'completed' | 'aborted'>;
  current_wave: Generated<number>;
  pause_reason: string | null;
  abort_mode: 'stop' | 'rollback' | null;
  rollback_done: Generated<boolean>;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
  finished_at: Timestamp | null;
}

export interface RolloutNodesTable {
  rollout_id: string;
  node_id: string;
  pool_id: string;
  wave: number;
  position: number;
  state: Generated<
    'pending' | 'updating' | 'soaking' | 'done' | 'failed' | 'skipped' | 'rolling-back' | 'rolled-back'
  >;
  from_version: string | null;
  start_epoch: ColumnType<string | null, number | string | null | undefined, number | string | null>;
  command_id: string | null;
  started_at: Timestamp | null;
  healthy_since: Timestamp | null;
  finished_at: Timestamp | null;
  reason: string | null;
  acknowledged: Generated<boolean>;
}

/** What bcd declared and reported about itself (migration 2026-11-30T50-releases-rollouts). */
export interface NodesTable {
  protocol_version: number | null;
  bcd_health: 'healthy' | 'unhealthy' | null;
  bcd_health_epoch: ColumnType<string | null, number | string | null | undefined, number | string | null>;
  bcd_update_report: ColumnType<Record<string, unknown> | null, string | null | undefined, string | null>;
}

export interface Database {
  releases: ReleasesTable;
  release_files: ReleaseFilesTable;
  rollouts: RolloutsTable;
  rollout_nodes: RolloutNodesTable;
  leases: LeasesTable;
}

/** A named lease (`pool:<id>`): one holder at a time, an epoch that grows with each new tenure. */
export interface LeasesTable {
  name: string;
  holder: string;
  epoch: ColumnType<string, number | string, number | string>;
  acquired_at: TimestampDefault;
  renewed_at: TimestampDefault;
  expires_at: Timestamp;
}
