import { Client, Connection } from '@temporalio/client';

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
}): Promise<TemporalClientHandle> {
  let connection: Connection;
  try {
    connection = await Connection.connect({
      address: options.address,
      connectTimeout: options.connectTimeoutMs ?? 5_000,
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
