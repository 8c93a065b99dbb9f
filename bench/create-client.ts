import http from 'node:http';

/** A tenant the bench creates reservations as. */
export interface BenchTenant {
  tenantId: string;
  token: string;
}

/** One create: GPUs in one NVLink domain for `duration`; with `waitMs`, waiting for its operation. */
export interface CreateShape {
  gpus: number;
  duration: string;
  waitMs?: number;
}

/**
 * `reservations.create` through the HTTP API as the benchmarks send it: node:http over kept-alive
 * sockets (at most `sockets`), so the load generator's own cost stays small beside what it
 * measures. Client `i` creates as tenant `i mod tenants`, each create under a new idempotency key
 * (`<keyPrefix><n>`: two generators against one API need different prefixes).
 */
export function createReservationClient(
  baseUrl: string,
  input: { poolId: string; tenants: readonly BenchTenant[]; keyPrefix: string; sockets: number },
) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: input.sockets });
  const url = new URL('/api/compute/reservations/create', baseUrl);
  const post = (token: string, body: unknown) =>
    new Promise<{ id: string; state: string }>((resolve, reject) => {
      const payload = JSON.stringify(body);
      const request = http.request(
        url,
        {
          method: 'POST',
          agent,
          headers: {
            authorization: `Bearer ${token}`,
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(payload),
            'x-better-compute': '1',
          },
        },
        (response) => {
          const chunks: Buffer[] = [];
          response.on('data', (chunk: Buffer) => chunks.push(chunk));
          response.on('error', reject);
          response.on('end', () => {
            try {
              const json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
                data?: { id: string; state: string };
                error?: { code: string; message: string };
              };
              if (json.error) reject(Object.assign(new Error(json.error.message), { code: json.error.code }));
              else resolve(json.data!);
            } catch (error) {
              reject(error);
            }
          });
        },
      );
      request.on('error', reject);
      request.end(payload);
    });
  let key = 0;
  return {
    post,
    /** One create by client `client`'s tenant: true when placed, false when left pending. */
    place: async (client: number, shape: CreateShape) => {
      const t = input.tenants[client % input.tenants.length]!;
      const r = await post(t.token, {
        tenantId: t.tenantId,
        poolId: input.poolId,
        devices: [{ class: 'gpu', count: shape.gpus, topology: 'nvlink-all' }],
        duration: shape.duration,
        idempotencyKey: `${input.keyPrefix}${key++}`,
        ...(shape.waitMs ? { wait: { timeoutMs: shape.waitMs } } : {}),
      });
      return r.state === 'placed';
    },
    close: () => agent.destroy(),
  };
}
