import type { CommandLane } from '../domain/fleet.ts';
import { Lane } from '../proto/gen/agent/v1/agent.ts';

/** Tunables of one gateway process; tests shorten the lease and the intervals. */
export interface GatewayOptions {
  gatewayId: string;
  trustDomain: string;
  /** A session's liveness lease (40 s by default): lapsed, the node is NodeUnreachable. */
  leaseMs: number;
  heartbeatIntervalMs: number;
  /** Sessions this gateway holds at most; beyond it, RESOURCE_EXHAUSTED with a retry pushback. */
  maxSessions: number;
  /**
   * How often the delivery loop looks for changed NodeSpecs (and for queued commands, when the
   * gateway has no LISTEN connection for command notifications).
   */
  deliveryIntervalMs: number;
  /**
   * Commands are pushed at the enqueuing commit (LISTEN/NOTIFY); this slow poll of every node
   * held here only covers a notification lost while the LISTEN connection was down and a
   * `not_before` coming due.
   */
  commandPollMs: number;
  /** Node certificate lifetime (at most 24 hours). */
  certificateTtlMs: number;
  credits: Record<CommandLane, number>;
  /**
   * A site agent's `provision` credits instead of `credits.provision`: its lane carries every
   * machine's BMC commands, which it runs side by side (`bcd site --bmc-concurrency`, 16 by default).
   */
  siteProvisionCredits: number;
  /** Per-session message rate (token bucket) and how many refusals end the session. */
  messagesPerSecond: number;
  messageBurst: number;
  maxRefusals: number;
  /** A connection without a Hello this long is closed; until its Hello it holds no session slot. */
  helloTimeoutMs: number;
  /** Connections one node certificate may hold open before their Hello; more are refused. */
  maxPendingHellosPerNode: number;
  /** The unauthenticated Join: calls per second (and burst) per peer address, and for all peers. */
  joinsPerSecondPerPeer: number;
  joinBurstPerPeer: number;
  joinsPerSecond: number;
  joinBurst: number;
  /**
   * Per node, kept across its sessions on this gateway: allocation reports per second (and burst)
   * and inventory reports per minute (and burst). Beyond them a message is refused (a `Refusal`
   * with RATE_LIMITED, a `ReportAck` not accepted) and changes nothing; `stats().rateLimited`
   * counts them.
   */
  reportsPerSecond: number;
  reportBurst: number;
  inventoryPerMinute: number;
  inventoryBurst: number;
  /** How often live sessions' certificates are checked again (a revoked one ends its session). */
  certificateCheckMs: number;
  maxMessageBytes: number;
}

export const defaultGatewayOptions: Omit<GatewayOptions, 'gatewayId' | 'trustDomain'> = {
  leaseMs: 40_000,
  heartbeatIntervalMs: 10_000,
  maxSessions: 20_000,
  deliveryIntervalMs: 200,
  commandPollMs: 5_000,
  certificateTtlMs: 24 * 60 * 60 * 1000,
  credits: { control: 8, provision: 2, bulk: 2 },
  siteProvisionCredits: 16,
  messagesPerSecond: 100,
  messageBurst: 200,
  maxRefusals: 500,
  helloTimeoutMs: 10_000,
  maxPendingHellosPerNode: 4,
  joinsPerSecondPerPeer: 10,
  joinBurstPerPeer: 50,
  joinsPerSecond: 250,
  joinBurst: 500,
  reportsPerSecond: 20,
  reportBurst: 256,
  inventoryPerMinute: 12,
  inventoryBurst: 12,
  certificateCheckMs: 15_000,
  maxMessageBytes: 1024 * 1024,
};

export const laneToProto: Record<CommandLane, Lane> = {
  control: Lane.LANE_CONTROL,
  provision: Lane.LANE_PROVISION,
  bulk: Lane.LANE_BULK,
};
