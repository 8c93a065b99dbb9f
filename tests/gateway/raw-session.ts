import { Metadata } from '@grpc/grpc-js';
import { gatewayChannel } from '../../daemon/gateway-tls.ts';
import type { NodeIdentity } from '../../daemon/identity.ts';
import {
  type AgentMessage,
  AgentServiceClient,
  type ControlMessage,
} from '../../proto/gen/agent/v1/agent.ts';

/**
 * A hand-driven session with a node's real identity, for sending what a daemon never would; with
 * `hello: false` it sends nothing at all (a connection that never says Hello).
 */
export async function openRawSession(
  identity: NodeIdentity,
  gateway: string,
  journalId = 'jrn_rawsession01',
  options: { hello?: boolean } = {},
) {
  const tls = gatewayChannel(gateway, identity);
  const client = new AgentServiceClient(gateway, tls.credentials, tls.options);
  const stream = client.session(new Metadata());
  const received: ControlMessage[] = [];
  let ended: { code: number; details: string } | null = null;
  stream.on('data', (m: ControlMessage) => received.push(m));
  stream.on('error', (e: { code: number; details: string }) => {
    ended = { code: e.code, details: e.details };
  });
  stream.on('end', () => {
    ended ??= { code: 0, details: 'end' };
  });
  const send = (m: AgentMessage) => stream.write(m);
  if (options.hello !== false)
    send({
      body: {
        $case: 'hello',
        value: {
          nodeId: identity.nodeId,
          agentVersion: 'raw',
          protocolVersion: 0,
          capabilities: [],
          journalId,
          lastAckedSeq: 0,
          observedGeneration: 0,
          inventory: [],
        },
      },
    });
  const wait = async <T>(pick: () => T | undefined | null, timeoutMs = 20_000): Promise<T> => {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const v = pick();
      if (v) return v;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error('raw session: nothing arrived in time');
  };
  return {
    received,
    send,
    wait,
    ended: () => ended,
    close: () => {
      stream.cancel();
      client.close();
    },
  };
}
