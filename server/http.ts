import type { AddressInfo } from 'node:net';
import { serve } from '@hono/node-server';
import type { Env, Hono } from 'hono';

export interface HttpServer {
  url: string;
  port: number;
  stop(): Promise<void>;
}

/**
 * Serves a Hono app on host:port (0 picks a free port). A busy port is one sentence that says
 * what to do, not a stack trace.
 */
export function listen<E extends Env>(app: Hono<E>, host: string, port: number): Promise<HttpServer> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: app.fetch, hostname: host, port }, (info: AddressInfo) => {
      resolve({
        url: `http://${host}:${info.port}`,
        port: info.port,
        stop: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
          }),
      });
    });
    server.once('error', (error: NodeJS.ErrnoException) => {
      reject(
        error.code === 'EADDRINUSE'
          ? new Error(
              `port ${port} on ${host} is already in use: stop what uses it or set BETTER_COMPUTE_API_PORT`,
            )
          : error,
      );
    });
  });
}
