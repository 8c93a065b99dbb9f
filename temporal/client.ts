import { readFileSync } from 'node:fs';
import { Client, Connection, type TLSConfig } from '@temporalio/client';
import type { Config } from '../core/config.ts';

/**
 * The TLS settings for the Temporal frontend from the configuration: none unless TEMPORAL_TLS is
 * `true` or a TEMPORAL_TLS_* file is given. A file that cannot be read is one sentence naming the
 * variable. The same value serves the client connection and the worker's native connection.
 */
export function temporalTls(
  config: Pick<
    Config,
    | 'TEMPORAL_TLS'
    | 'TEMPORAL_TLS_CA_PATH'
    | 'TEMPORAL_TLS_CERT_PATH'
    | 'TEMPORAL_TLS_KEY_PATH'
    | 'TEMPORAL_TLS_SERVER_NAME'
  >,
): TLSConfig | undefined {
  const files = config.TEMPORAL_TLS_CA_PATH ?? config.TEMPORAL_TLS_CERT_PATH ?? config.TEMPORAL_TLS_KEY_PATH;
  if (config.TEMPORAL_TLS === 'false' || (config.TEMPORAL_TLS !== 'true' && !files)) return undefined;
  if (Boolean(config.TEMPORAL_TLS_CERT_PATH) !== Boolean(config.TEMPORAL_TLS_KEY_PATH)) {
    throw new Error(
      'TEMPORAL_TLS_CERT_PATH and TEMPORAL_TLS_KEY_PATH go together: set both for mutual TLS, or neither',
    );
  }
  const read = (name: string, file: string) => {
    try {
      return readFileSync(file);
    } catch (error) {
      throw new Error(`${name} (${file}) cannot be read: ${(error as Error).message}`);
    }
  };
  return {
    ...(config.TEMPORAL_TLS_SERVER_NAME ? { serverNameOverride: config.TEMPORAL_TLS_SERVER_NAME } : {}),
    ...(config.TEMPORAL_TLS_CA_PATH
      ? { serverRootCACertificate: read('TEMPORAL_TLS_CA_PATH', config.TEMPORAL_TLS_CA_PATH) }
      : {}),
    ...(config.TEMPORAL_TLS_CERT_PATH && config.TEMPORAL_TLS_KEY_PATH
      ? {
          clientCertPair: {
            crt: read('TEMPORAL_TLS_CERT_PATH', config.TEMPORAL_TLS_CERT_PATH),
            key: read('TEMPORAL_TLS_KEY_PATH', config.TEMPORAL_TLS_KEY_PATH),
          },
        }
      : {}),
  };
}

export interface TemporalClientHandle {
  client: Client;
  connection: Connection;
  close(): Promise<void>;
}

/**
 * Connects a Temporal client to `address` in `namespace`. An unreachable server is one clear
 * sentence naming the address and what to do, not a gRPC stack trace.
 */
export async function connectTemporal(options: {
  address: string;
  namespace?: string;
  connectTimeoutMs?: number;
  /** TLS to the frontend (`temporalTls(config)`); plain gRPC without it. */
  tls?: TLSConfig;
}): Promise<TemporalClientHandle> {
  let connection: Connection;
  try {
    connection = await Connection.connect({
      address: options.address,
      connectTimeout: options.connectTimeoutMs ?? 5_000,
      ...(options.tls ? { tls: options.tls } : {}),
    });
    await connection.workflowService.getSystemInfo({});
  } catch (error) {
    throw new Error(
      `Temporal at ${options.address} is not reachable (${error instanceof Error ? error.message : String(error)}): start it with \`better-compute dev\` or point TEMPORAL_ADDRESS at a running Temporal server`,
    );
  }
  const client = new Client({ connection, namespace: options.namespace ?? 'default' });
  return { client, connection, close: () => connection.close() };
}
