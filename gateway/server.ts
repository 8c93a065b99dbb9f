import { Server, type ServerDuplexStream, status } from '@grpc/grpc-js';
import { ulid } from 'ulid';
import { requireDeploymentSecret } from '../core/config.ts';
import type { Deps } from '../core/deps.ts';
import { createOutageLog } from '../core/outage-log.ts';
import { loadSigningCertificateAuthority } from '../db/nodes/certificate-authority.ts';
import { findPeerCertificate, type PeerCertificateRow } from '../db/nodes/certificates.ts';
import { issueServerCertificate } from '../domain/pki.ts';
import { createSealer } from '../domain/sealing.ts';
import {
  type AgentMessage,
  AgentServiceService,
  type ControlMessage,
  JoinServiceService,
} from '../proto/gen/agent/v1/agent.ts';
import type { GatewayContext } from './context.ts';
import { Dispatcher } from './dispatch.ts';
import { createJoinService, JoinThrottle } from './join-service.ts';
import { NodeRateLimits } from './node-rate-limits.ts';
import { defaultGatewayOptions, type GatewayOptions } from './options.ts';
import { SessionRegistry } from './registry.ts';
import { NodeSession } from './session.ts';
import { gatewayCredentials, verifiedPeer } from './tls.ts';

export interface StartedGateway {
  address: string;
  port: number;
  caCertificatePem: string;
  gatewayId: string;
  /** The sessions held now (tests and benchmarks read it). */
  sessionCount(): number;
  /**
   * Sessions held and being opened, connections waiting for their Hello, refusals at the session
   * limit, messages refused by the per-node report and inventory budgets, joins throttled.
   */
  stats(): {
    sessions: number;
    opening: number;
    awaitingHello: number;
    refused: number;
    rateLimited: number;
    joinsThrottled: number;
    /** Whether command notifications are heard now, and how many LISTEN connections were made. */
    commandNotifications: { listening: boolean; connections: number };
  };
  stop(): Promise<void>;
}

const sessionRoles = new Set(['node', 'node-tenant', 'site', 'ramdisk']);

/**
 * Starts the gateway: JoinService and the session service on one TLS port served with the
 * control plane's own CA (created on first use). Sessions need a client certificate from that CA
 * that the node table knows, unrevoked, unexpired and of a role that runs workloads. The CA's
 * private key is stored sealed: without BETTER_COMPUTE_SECRET (the one it was sealed with) the
 * gateway refuses to start.
 */
export async function startGateway(
  deps: Pick<Deps, 'config' | 'db' | 'log' | 'lifecycle'> & {
    host?: string;
    port?: number;
    options?: Partial<Omit<GatewayOptions, 'trustDomain'>>;
    onCommandCompleted?: (commandId: string) => void;
  },
): Promise<StartedGateway> {
  const trustDomain = deps.config.BETTER_COMPUTE_TRUST_DOMAIN;
  // The gateway signs node certificates, so it is the one mode that opens the CA's private key.
  const sealer = createSealer(requireDeploymentSecret(deps.config, 'the gateway'));
  const options: GatewayOptions = {
    ...defaultGatewayOptions,
    gatewayId: `gw_${ulid().toLowerCase()}`,
    leaseMs: deps.config.BETTER_COMPUTE_GATEWAY_LEASE_SECONDS * 1000,
    // Four heartbeats per lease at least: a lease as short as the default interval (10 s) would
    // lapse healthy sessions on any delay, marking their nodes unreachable over and over.
    heartbeatIntervalMs: Math.min(
      defaultGatewayOptions.heartbeatIntervalMs,
      (deps.config.BETTER_COMPUTE_GATEWAY_LEASE_SECONDS * 1000) / 4,
    ),
    maxSessions: deps.config.BETTER_COMPUTE_GATEWAY_MAX_SESSIONS,
    helloTimeoutMs: deps.config.BETTER_COMPUTE_GATEWAY_HELLO_TIMEOUT_SECONDS * 1000,
    commandPollMs: deps.config.BETTER_COMPUTE_GATEWAY_COMMAND_POLL_SECONDS * 1000,
    siteProvisionCredits: deps.config.BETTER_COMPUTE_GATEWAY_SITE_BMC_CREDITS,
    joinsPerSecondPerPeer: deps.config.BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND_PER_PEER,
    joinBurstPerPeer: Math.ceil(deps.config.BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND_PER_PEER * 5),
    joinsPerSecond: deps.config.BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND,
    joinBurst: Math.ceil(deps.config.BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND * 2),
    ...deps.options,
    trustDomain,
  };
  const host = deps.host ?? deps.config.BETTER_COMPUTE_GATEWAY_HOST;
  const log = deps.log.child({ component: 'gateway', gatewayId: options.gatewayId });
  const ca = await loadSigningCertificateAuthority(deps.db, { trustDomain, sealer });
  const serverCert = await issueServerCertificate({
    ca,
    trustDomain,
    hosts: [host, 'localhost', '127.0.0.1', '::1'],
  });
  const registry = new SessionRegistry(options);
  const outage = createOutageLog(
    log,
    'node sessions and joins are answered UNAVAILABLE (the nodes retry) and the gateway retries its loops',
  );
  const ctx: GatewayContext = {
    db: deps.db,
    log,
    outage,
    options,
    registry,
    rates: new NodeRateLimits(options),
    sealer,
    ...(deps.lifecycle ? { lifecycle: deps.lifecycle } : {}),
    ...(deps.onCommandCompleted ? { onCommandCompleted: deps.onCommandCompleted } : {}),
  };
  const server = new Server({
    'grpc.max_receive_message_length': options.maxMessageBytes,
    'grpc.max_send_message_length': 16 * 1024 * 1024,
    // Daemons ping every 30 s; the gateway's own pings only find dead TCP connections (the
    // liveness lease decides reachability), so they can be rare.
    'grpc.keepalive_time_ms': 120_000,
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 5_000,
    // Channelz stays on although nothing reads it: grpc-js (1.14) tracks a server's sessions for
    // forceShutdown only in its channelz handler, so without it a stopping gateway would leave the
    // calls in flight uncut (tests/gateway/join-retry.test.ts).
  });
  const joinThrottle = new JoinThrottle(options);
  server.addService(
    JoinServiceService,
    createJoinService({
      db: deps.db,
      log,
      ca,
      trustDomain,
      certificateTtlMs: options.certificateTtlMs,
      throttle: joinThrottle,
      outage,
    }),
  );
  server.addService(AgentServiceService, {
    session: (call: ServerDuplexStream<AgentMessage, ControlMessage>) => {
      void acceptSession(ctx, call);
    },
  });
  const credentials = gatewayCredentials({
    caCertificatePem: ca.certificatePem,
    certificatePem: serverCert.certificatePem,
    privateKeyPem: serverCert.privateKeyPem,
  });
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(
      `${host.includes(':') ? `[${host}]` : host}:${deps.port ?? deps.config.BETTER_COMPUTE_GATEWAY_PORT}`,
      credentials,
      (err, bound) => (err ? reject(err) : resolve(bound)),
    );
  });
  const dispatcher = new Dispatcher(ctx);
  ctx.commands = dispatcher.commands;
  dispatcher.start();
  const address = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  log.info({ address }, 'gateway started');
  return {
    address,
    port,
    caCertificatePem: ca.certificatePem,
    gatewayId: options.gatewayId,
    sessionCount: () => registry.size,
    stats: () => ({
      ...registry.stats(),
      rateLimited: ctx.rates.refused,
      joinsThrottled: joinThrottle.refused,
      commandNotifications: dispatcher.commands.listening(),
    }),
    stop: async () => {
      await dispatcher.stop();
      for (const session of registry.sessions.values())
        (session as NodeSession).end(status.UNAVAILABLE, 'gateway stopping');
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, 2_000);
        server.tryShutdown(() => {
          clearTimeout(timer);
          resolve();
        });
      });
      log.info('gateway stopped');
    },
  };
}

/** Checks the peer certificate against the node table, then runs the session (its Hello meets the limit). */
async function acceptSession(ctx: GatewayContext, call: ServerDuplexStream<AgentMessage, ControlMessage>) {
  const refuse = (code: number, details: string, extra: Record<string, unknown> = {}) => {
    ctx.log.warn({ peer: call.getPeer(), code, ...extra }, `session refused: ${details}`);
    call.emit('error', { code, details });
  };
  const peer = verifiedPeer(call);
  if (!peer) return refuse(status.UNAUTHENTICATED, 'no client certificate from the control plane CA');
  let cert: PeerCertificateRow | null;
  try {
    cert = await findPeerCertificate(ctx.db, peer.serial);
  } catch (error) {
    const unavailable = ctx.outage.unavailable(error, 'session');
    if (unavailable) {
      call.emit('error', { code: status.UNAVAILABLE, details: unavailable.message });
      return;
    }
    cert = null;
  }
  if (!cert) return refuse(status.UNAUTHENTICATED, 'unknown certificate', { serial: peer.serial });
  const who = { serial: peer.serial, nodeId: cert.nodeId };
  if (cert.revoked) return refuse(status.UNAUTHENTICATED, 'certificate revoked', who);
  if (cert.expired) return refuse(status.UNAUTHENTICATED, 'certificate expired', who);
  if (cert.spiffeId !== peer.spiffeId)
    return refuse(status.UNAUTHENTICATED, 'certificate name mismatch', who);
  if (!sessionRoles.has(cert.role))
    return refuse(status.PERMISSION_DENIED, `role ${cert.role} holds no session`, who);
  if (cert.provisionState === 'retired') return refuse(status.PERMISSION_DENIED, 'node retired', who);
  // Until its Hello a connection holds no session slot (the limit is decided at Hello), but one
  // node certificate may keep only a few connections waiting.
  const refusal = ctx.registry.awaitHello(cert.nodeId);
  if (refusal) {
    ctx.log.debug({ nodeId: cert.nodeId }, 'session refused: too many connections waiting for Hello');
    call.emit('error', refusal);
    return;
  }
  new NodeSession(ctx, call, cert).run();
}
