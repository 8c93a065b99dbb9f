import { z } from 'zod';

/** How a process runs: the API, the Temporal worker, the gRPC gateway, or all three together. */
export const processModes = ['api', 'worker', 'gateway', 'all'] as const;
export type ProcessMode = (typeof processModes)[number];

const port = z.coerce.number().int().min(0).max(65535);

/**
 * The one configuration every process parses at start; nothing else reads process.env.
 * Unknown BETTER_COMPUTE_* variables are ignored; a bad value stops the process with its name.
 */
export const configSchema = z.object({
  DATABASE_URL: z.string().url().optional(),
  TEMPORAL_ADDRESS: z.string().min(1).optional(),
  TEMPORAL_NAMESPACE: z.string().min(1).default('default'),
  BETTER_COMPUTE_TASK_QUEUE: z.string().min(1).default('better-compute'),
  BETTER_COMPUTE_API_HOST: z.string().default('127.0.0.1'),
  BETTER_COMPUTE_API_PORT: port.default(7070),
  BETTER_COMPUTE_GATEWAY_HOST: z.string().default('127.0.0.1'),
  BETTER_COMPUTE_GATEWAY_PORT: port.default(7443),
  /** A bcd session's liveness lease; lapsed, the node is NodeUnreachable (nothing is released). */
  BETTER_COMPUTE_GATEWAY_LEASE_SECONDS: z.coerce.number().int().min(2).max(3600).default(40),
  /** Sessions one gateway holds at most; beyond it, RESOURCE_EXHAUSTED with a retry pushback. */
  BETTER_COMPUTE_GATEWAY_MAX_SESSIONS: z.coerce.number().int().min(1).max(1_000_000).default(20_000),
  BETTER_COMPUTE_TRUST_DOMAIN: z.string().min(1).default('better-compute.local'),
  BETTER_COMPUTE_DATA_DIR: z.string().min(1).default('.data'),
  BETTER_COMPUTE_TOOLS_DIR: z.string().optional(),
  BETTER_COMPUTE_DB_POOL_MAX: z.coerce.number().int().min(1).max(500).default(20),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
});

export type Config = z.infer<typeof configSchema>;

export function parseConfig(env: Record<string, string | undefined> = process.env): Config {
  const result = configSchema.safeParse(env);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    throw new Error(`configuration ${issue.path.join('.')} is invalid: ${issue.message}`);
  }
  return result.data;
}
