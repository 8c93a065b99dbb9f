import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { certificateNotAfter } from '../domain/pki.ts';
import { heldAllocationIds } from './devices.ts';

/** What `bcd status` shows: the node, its certificate's expiry, its holds, its journal and session. */
export interface DaemonStatus {
  joined: boolean;
  nodeId: string | null;
  nodeName: string | null;
  gateway: string | null;
  certificateNotAfter: string | null;
  certificateExpiresInSeconds: number | null;
  holds: Array<{ allocationId: string; cdiDevices: string[]; envFile: string }>;
  journalId: string | null;
  convergedGeneration: number | null;
  session: { connected: boolean; epoch: number; updatedAt: string } | null;
}

export function readDaemonStatus(
  input: { dir: string; cdiDir: string; envDir: string },
  now = Date.now(),
): DaemonStatus {
  const metaFile = path.join(input.dir, 'node.json');
  if (!existsSync(metaFile)) {
    return {
      joined: false,
      nodeId: null,
      nodeName: null,
      gateway: null,
      certificateNotAfter: null,
      certificateExpiresInSeconds: null,
      holds: [],
      journalId: null,
      convergedGeneration: null,
      session: null,
    };
  }
  const meta = JSON.parse(readFileSync(metaFile, 'utf8'));
  const notAfter = certificateNotAfter(readFileSync(path.join(input.dir, 'cert.pem'), 'utf8'));
  const journalFile = path.join(input.dir, 'journal.json');
  const journal = existsSync(journalFile) ? JSON.parse(readFileSync(journalFile, 'utf8')) : null;
  const sessionFile = path.join(input.dir, 'session.json');
  const session = existsSync(sessionFile) ? JSON.parse(readFileSync(sessionFile, 'utf8')) : null;
  const holds = heldAllocationIds({ cdiDir: input.cdiDir, envDir: input.envDir }).map((allocationId) => {
    const spec = JSON.parse(readFileSync(path.join(input.cdiDir, `bcd-${allocationId}.json`), 'utf8'));
    return {
      allocationId,
      cdiDevices: (spec.devices as Array<{ name: string }>).map((d) => `bcd.dev/gpu=${d.name}`),
      envFile: path.join(input.envDir, `${allocationId}.env`),
    };
  });
  return {
    joined: true,
    nodeId: meta.nodeId,
    nodeName: meta.nodeName,
    gateway: meta.gateway,
    certificateNotAfter: notAfter.toISOString(),
    certificateExpiresInSeconds: Math.round((notAfter.getTime() - now) / 1000),
    holds,
    journalId: journal?.journalId ?? null,
    convergedGeneration: journal?.convergedGeneration ?? null,
    session,
  };
}

export function formatDaemonStatus(status: DaemonStatus): string {
  if (!status.joined) return 'not joined (run bcd join --token … --gateway … --ca-file …)';
  const lines = [
    `node          ${status.nodeName} (${status.nodeId})`,
    `gateway       ${status.gateway}`,
    `certificate   expires ${status.certificateNotAfter} (in ${Math.round((status.certificateExpiresInSeconds ?? 0) / 60)} min)`,
    `session       ${status.session ? `${status.session.connected ? 'connected' : 'disconnected'}, epoch ${status.session.epoch}, as of ${status.session.updatedAt}` : 'unknown (bcd node not running)'}`,
    `journal       ${status.journalId}, converged generation ${status.convergedGeneration}`,
    `holds         ${status.holds.length === 0 ? 'none' : ''}`,
  ];
  for (const hold of status.holds)
    lines.push(`  ${hold.allocationId}  ${hold.cdiDevices.join(' ')}  ${hold.envFile}`);
  return lines.join('\n');
}
