import { type OpenedNodeSession, openNodeSession } from '../db/nodes/sessions.ts';
import { ComputeError } from '../domain/errors.ts';
import type { CommandLane } from '../domain/fleet.ts';
import { inventorySections } from '../domain/inventory-sections.ts';
import { acceptProtocolVersion } from '../domain/release-version.ts';
import type { Hello, Welcome } from '../proto/gen/agent/v1/agent.ts';
import type { GatewayContext } from './context.ts';
import { type GatewayOptions, laneToProto } from './options.ts';

const capabilityPattern = /^[a-z0-9][a-z0-9.-]{0,63}$/;

export interface OpenedSession extends OpenedNodeSession {
  /** The inventory sections the node should send: those it lacks or whose hash differs. */
  wantSections: string[];
}

/**
 * Opens a session for a Hello: checks the Hello, opens it in one statement (`openNodeSession`:
 * a new epoch fences any older session; a lost journal's in-flight commands fail) and answers
 * which inventory sections the node should send.
 */
export async function openSession(ctx: GatewayContext, nodeId: string, hello: Hello): Promise<OpenedSession> {
  if (!/^[A-Za-z0-9_-]{8,100}$/.test(hello.journalId)) {
    throw new ComputeError('INVALID_INPUT', 'Hello needs a journal id (8 to 100 characters)');
  }
  if (hello.capabilities.length > 64 || hello.agentVersion.length > 100) {
    throw new ComputeError('INVALID_INPUT', 'Hello is oversized');
  }
  const capabilities = [...new Set(hello.capabilities)].filter((c) => capabilityPattern.test(c)).sort();
  // N-2: a bcd newer than this control plane, or older than two protocols back, never opens.
  const protocolVersion = acceptProtocolVersion(hello.protocolVersion);
  const opened = await openNodeSession(ctx.db, {
    nodeId,
    gatewayId: ctx.options.gatewayId,
    agentVersion: hello.agentVersion || null,
    protocolVersion,
    capabilities,
    journalId: hello.journalId,
  });
  const held = opened.heldSectionHashes;
  const offered = new Map(hello.inventory.map((s) => [s.name, s.hash]));
  const wantSections = Object.keys(inventorySections).filter(
    (name) => !offered.has(name) || held.get(name) !== offered.get(name),
  );
  return { ...opened, wantSections };
}

/** The Welcome that answers a Hello: epoch, heartbeat interval, lease, wanted sections, credits. */
export function welcomeFor(options: GatewayOptions, opened: OpenedSession): Welcome {
  return {
    epoch: opened.epoch,
    heartbeatIntervalMs: options.heartbeatIntervalMs,
    leaseMs: options.leaseMs,
    wantSections: opened.wantSections,
    credits: (Object.keys(options.credits) as CommandLane[]).map((lane) => ({
      lane: laneToProto[lane],
      credits: options.credits[lane],
    })),
    gatewayId: options.gatewayId,
  };
}
