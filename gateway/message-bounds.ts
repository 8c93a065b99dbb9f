import { assertNever, ComputeError } from '../domain/errors.ts';
import type { AgentMessage, JoinRequest, RenewRequest } from '../proto/gen/agent/v1/agent.ts';

/**
 * The bounds of every field of every message the gateway accepts, checked before anything else
 * reads the message (no parsing, no regular expression, no database), so an oversized field costs
 * one comparison. A field over its bound is refused with INVALID_INPUT (gRPC INVALID_ARGUMENT)
 * naming the field (`details.field`) and its limit; nothing is truncated silently. The gRPC
 * server's own `grpc.max_receive_message_length` bounds a whole message before it is decoded.
 */
export const messageBounds = {
  join: {
    token: 200,
    csrPem: 8 * 1024,
    requestedName: 253,
    agentVersion: 100,
    productUuid: 64,
    serialNumber: 128,
    macs: 256,
    mac: 64,
    gpuUuids: 64,
    gpuUuid: 64,
    hostname: 253,
    proofNodeId: 100,
    proofKeyId: 128,
    proofSignatureBytes: 256,
  },
  renew: { csrPem: 8 * 1024 },
  hello: {
    nodeId: 100,
    agentVersion: 100,
    capabilities: 64,
    capability: 64,
    journalId: 100,
    inventory: 16,
    sectionName: 64,
    sectionHash: 128,
  },
  inventory: { sections: 16, sectionName: 64, sectionHash: 128, sectionBytes: 512 * 1024 },
  specStatus: { error: 8 * 1024 },
  commandResult: { commandId: 100, resultBytes: 64 * 1024, resultDepth: 32, error: 8 * 1024 },
  report: { bodyBytes: 16 * 1024, keyId: 128, signatureBytes: 512 },
  updateStatus: { releaseId: 100, version: 100, state: 32, message: 2 * 1024 },
} as const;

function tooLarge(field: string, limit: number, unit: string): ComputeError {
  return new ComputeError('INVALID_INPUT', `${field} is longer than ${limit} ${unit}`, { field, limit });
}

function text(field: string, value: string, max: number): void {
  if (value.length > max) throw tooLarge(field, max, 'characters');
}

function bytes(field: string, value: Uint8Array, max: number): void {
  if (value.length > max) throw tooLarge(field, max, 'bytes');
}

function list<T>(field: string, values: readonly T[], max: number, each?: (value: T, at: string) => void) {
  if (values.length > max) throw tooLarge(field, max, 'items');
  if (!each) return;
  for (let i = 0; i < values.length; i++) each(values[i]!, `${field}[${i}]`);
}

/** Checks every field of a Join request (INVALID_INPUT naming the first field over its bound). */
export function checkJoinRequest(request: JoinRequest): void {
  const b = messageBounds.join;
  text('token', request.token, b.token);
  text('csrPem', request.csrPem, b.csrPem);
  text('requestedName', request.requestedName, b.requestedName);
  text('agentVersion', request.agentVersion, b.agentVersion);
  const evidence = request.evidence;
  if (evidence) {
    text('evidence.productUuid', evidence.productUuid, b.productUuid);
    text('evidence.serialNumber', evidence.serialNumber, b.serialNumber);
    text('evidence.hostname', evidence.hostname, b.hostname);
    list('evidence.macs', evidence.macs, b.macs, (mac, at) => text(at, mac, b.mac));
    list('evidence.gpuUuids', evidence.gpuUuids, b.gpuUuids, (uuid, at) => text(at, uuid, b.gpuUuid));
  }
  const proof = request.reclaimProof;
  if (proof) {
    text('reclaimProof.nodeId', proof.nodeId, b.proofNodeId);
    text('reclaimProof.keyId', proof.keyId, b.proofKeyId);
    bytes('reclaimProof.signature', proof.signature, b.proofSignatureBytes);
  }
}

/**
 * How deeply `json` nests arrays and objects, in one pass over its characters (strings skipped),
 * without parsing it: a deep document is refused before the parser or PostgreSQL's jsonb sees it.
 */
export function jsonNestingDepth(json: string): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // a backslash escapes the next character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) deepest = Math.max(deepest, ++depth);
    else if (c === 0x5d || c === 0x7d) depth--;
  }
  return deepest;
}

/** Checks a Renew request. */
export function checkRenewRequest(request: RenewRequest): void {
  text('csrPem', request.csrPem, messageBounds.renew.csrPem);
}

/** Checks every field of a session message, whatever its kind. */
export function checkAgentMessage(message: AgentMessage): void {
  const body = message.body;
  if (!body) return;
  switch (body.$case) {
    case 'hello': {
      const b = messageBounds.hello;
      const hello = body.value;
      text('hello.nodeId', hello.nodeId, b.nodeId);
      text('hello.agentVersion', hello.agentVersion, b.agentVersion);
      text('hello.journalId', hello.journalId, b.journalId);
      list('hello.capabilities', hello.capabilities, b.capabilities, (c, at) => text(at, c, b.capability));
      list('hello.inventory', hello.inventory, b.inventory, (section, at) => {
        text(`${at}.name`, section.name, b.sectionName);
        text(`${at}.hash`, section.hash, b.sectionHash);
      });
      return;
    }
    case 'heartbeat':
      return;
    case 'inventory': {
      const b = messageBounds.inventory;
      list('inventory.sections', body.value.sections, b.sections, (section, at) => {
        text(`${at}.name`, section.name, b.sectionName);
        text(`${at}.hash`, section.hash, b.sectionHash);
        bytes(`${at}.data`, section.data, b.sectionBytes);
      });
      return;
    }
    case 'specStatus':
      text('specStatus.error', body.value.error, messageBounds.specStatus.error);
      return;
    case 'commandResult': {
      const b = messageBounds.commandResult;
      text('commandResult.commandId', body.value.commandId, b.commandId);
      bytes('commandResult.resultJson', body.value.resultJson, b.resultBytes);
      if (jsonNestingDepth(Buffer.from(body.value.resultJson).toString('utf8')) > b.resultDepth) {
        throw new ComputeError(
          'INVALID_INPUT',
          `commandResult.resultJson nests deeper than ${b.resultDepth} levels`,
          { field: 'commandResult.resultJson', limit: b.resultDepth },
        );
      }
      text('commandResult.error', body.value.error, b.error);
      return;
    }
    case 'report': {
      const b = messageBounds.report;
      bytes('report.body', body.value.body, b.bodyBytes);
      text('report.keyId', body.value.keyId, b.keyId);
      bytes('report.signature', body.value.signature, b.signatureBytes);
      return;
    }
    case 'updateStatus': {
      const b = messageBounds.updateStatus;
      text('updateStatus.releaseId', body.value.releaseId, b.releaseId);
      text('updateStatus.version', body.value.version, b.version);
      text('updateStatus.state', body.value.state, b.state);
      text('updateStatus.message', body.value.message, b.message);
      return;
    }
    default:
      assertNever(body);
  }
}
