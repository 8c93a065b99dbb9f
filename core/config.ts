import { z } from 'zod';
import { deploymentSecretHint, minDeploymentSecretLength } from '../domain/sealing.ts';
import { webhookAllowHostsSetting } from '../domain/webhook-target.ts';
import { logFormats } from './logger.ts';

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
  /**
   * TLS to the Temporal frontend (`true`/`false`); on when any TEMPORAL_TLS_* file is given. The
   * names are the Temporal CLI's flags (`--tls-ca-path`...), so one set of variables serves both.
   */
  TEMPORAL_TLS: z.enum(['true', 'false']).optional(),
  /** The CA that signed the frontend's certificate (PEM file); absent: the system's roots. */
  TEMPORAL_TLS_CA_PATH: z.string().min(1).optional(),
  /** A client certificate and its key (PEM files), for a frontend that asks for mutual TLS. */
  TEMPORAL_TLS_CERT_PATH: z.string().min(1).optional(),
  TEMPORAL_TLS_KEY_PATH: z.string().min(1).optional(),
  /** The name the frontend's certificate is checked against, when it differs from the address's host. */
  TEMPORAL_TLS_SERVER_NAME: z.string().min(1).optional(),
  BETTER_COMPUTE_TASK_QUEUE: z.string().min(1).default('better-compute'),
  BETTER_COMPUTE_API_HOST: z.string().default('127.0.0.1'),
  BETTER_COMPUTE_API_PORT: port.default(7070),
  BETTER_COMPUTE_GATEWAY_HOST: z.string().default('127.0.0.1'),
  BETTER_COMPUTE_GATEWAY_PORT: port.default(7443),
  /** A bcd session's liveness lease; lapsed, the node is NodeUnreachable (nothing is released). */
  BETTER_COMPUTE_GATEWAY_LEASE_SECONDS: z.coerce.number().int().min(2).max(3600).default(40),
  /** Sessions one gateway holds at most; beyond it, RESOURCE_EXHAUSTED with a retry pushback. */
  BETTER_COMPUTE_GATEWAY_MAX_SESSIONS: z.coerce.number().int().min(1).max(1_000_000).default(20_000),
  /** A bcd connection that sends no Hello this long is closed; until then it holds no session slot. */
  BETTER_COMPUTE_GATEWAY_HELLO_TIMEOUT_SECONDS: z.coerce.number().positive().max(600).default(10),
  /** Commands are pushed at their enqueue's commit; this slow poll only covers a lost notification. */
  BETTER_COMPUTE_GATEWAY_COMMAND_POLL_SECONDS: z.coerce.number().min(0.05).max(600).default(5),
  /** Join calls per second one peer address may make (bursts of five times as many); then RESOURCE_EXHAUSTED. */
  BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND_PER_PEER: z.coerce.number().positive().max(100_000).default(10),
  /**
   * Join calls per second the gateway takes from all peers together (bursts of twice as many):
   * 10,000 machines powering on at once join within 40 s (bench/herd.ts: a Join costs the gateway
   * and PostgreSQL a few ms of CPU).
   */
  BETTER_COMPUTE_GATEWAY_JOINS_PER_SECOND: z.coerce.number().positive().max(1_000_000).default(250),
  /** BMC commands in flight to a site agent at once (it runs different machines' side by side). */
  BETTER_COMPUTE_GATEWAY_SITE_BMC_CREDITS: z.coerce.number().int().min(1).max(1024).default(16),
  BETTER_COMPUTE_TRUST_DOMAIN: z.string().min(1).default('better-compute.local'),
  /**
   * The deployment secret: the CA private key and webhook signing secrets are sealed at rest with
   * keys derived from it (domain/sealing.ts). Every process of a deployment needs the same one;
   * the modes in `modesNeedingSecret` refuse to start without it.
   */
  BETTER_COMPUTE_SECRET: z
    .string()
    .min(
      minDeploymentSecretLength,
      `at least ${minDeploymentSecretLength} characters (${deploymentSecretHint})`,
    )
    .optional(),
  BETTER_COMPUTE_DATA_DIR: z.string().min(1).default('.data'),
  BETTER_COMPUTE_TOOLS_DIR: z.string().optional(),
  BETTER_COMPUTE_DB_POOL_MAX: z.coerce.number().int().min(1).max(500).default(20),
  /** API calls per second one token may make (a token bucket, refilled continuously); 0 turns it off. */
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: z.coerce.number().min(0).max(1_000_000).default(50),
  /** How many calls a token may make at once before its rate applies. */
  BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN_BURST: z.coerce.number().int().min(1).max(10_000_000).default(200),
  /** API calls per second all of one tenant's tokens may make together; 0 turns it off. */
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: z.coerce.number().min(0).max(1_000_000).default(200),
  BETTER_COMPUTE_RATE_LIMIT_PER_TENANT_BURST: z.coerce.number().int().min(1).max(10_000_000).default(1000),
  /**
   * Development only: comma-separated `host[:port]` webhook targets that may be plain http and
   * private addresses (`localhost,127.0.0.1:8080,[::1]`). Absent: https to public addresses only.
   */
  BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS: webhookAllowHostsSetting.optional(),
  /** Live webhooks one tenant may have; one more is QUOTA_EXCEEDED. */
  BETTER_COMPUTE_WEBHOOKS_PER_TENANT: z.coerce.number().int().min(1).max(10_000).default(25),
  /** Open event streams one token may hold in one API process; one more is RATE_LIMITED. */
  BETTER_COMPUTE_EVENT_STREAMS_PER_TOKEN: z.coerce.number().int().min(1).max(100_000).default(8),
  /** Open event streams all of one tenant's tokens may hold in one API process. */
  BETTER_COMPUTE_EVENT_STREAMS_PER_TENANT: z.coerce.number().int().min(1).max(1_000_000).default(64),
  /** How many events behind the newest an event stream may resume (events.list pages further back). */
  BETTER_COMPUTE_EVENT_STREAM_REPLAY_MAX_EVENTS: z.coerce
    .number()
    .int()
    .min(1)
    .max(1_000_000_000)
    .default(10_000),
  /** How old the events a stream resumes from, or events.list pages from, may be (both doors). */
  BETTER_COMPUTE_EVENT_REPLAY_MAX_AGE_HOURS: z.coerce.number().positive().max(87_600).default(168),
  /**
   * How long what a refused request leaves (a draft kept for a retry with the same key, a denial,
   * an expired confirmation) is kept before the worker's sweeper removes it.
   */
  BETTER_COMPUTE_DRAFT_RETENTION_HOURS: z.coerce.number().positive().max(8_760).default(24),
  /**
   * Most workflows the worker keeps in its sticky cache; unset, 250 (`defaultWorkflowCache`). An
   * evicted workflow is replayed from its history when it next wakes.
   */
  BETTER_COMPUTE_WORKFLOW_CACHE: z.coerce.number().int().min(0).max(100_000).optional(),
  /**
   * The release signers the control plane trusts, by pin: comma-separated `sha256/<base64 of the
   * SHA-256 of the Ed25519 public key's SubjectPublicKeyInfo>` (`better-compute releases keygen`
   * prints one). Without pins every release is refused.
   */
  BETTER_COMPUTE_RELEASE_PINS: z
    .string()
    .default('')
    .transform((v) =>
      v
        .split(',')
        .map((p) => p.trim())
        .filter(Boolean),
    )
    .pipe(z.array(z.string().regex(/^sha256\/[A-Za-z0-9+/]{43}=$/, 'pins of the form sha256/<base64>'))),
  /**
   * The image signers bare-metal deploys trust, by pin (`sha256/<base64>`, comma-separated): an
   * image whose signature checks against one of them is `verified` and usable by every tenant;
   * any other image stays private to its tenant.
   */
  BETTER_COMPUTE_IMAGE_SIGNER_PINS: z
    .string()
    .default('')
    .transform((v) =>
      v
        .split(',')
        .map((p) => p.trim())
        .filter(Boolean),
    )
    .pipe(z.array(z.string().regex(/^sha256\/[A-Za-z0-9+/]{43}=$/, 'pins of the form sha256/<base64>'))),
  /** How many distinct pinned signers a release needs (k of the n pins). */
  BETTER_COMPUTE_RELEASE_THRESHOLD: z.coerce.number().int().min(1).max(16).default(1),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** `auto`: pretty lines on a terminal, JSON when stdout is piped or redirected. */
  LOG_FORMAT: z.enum(logFormats).default('auto'),
});

export type Config = z.infer<typeof configSchema>;

/**
 * The modes that read or write sealed data, so need BETTER_COMPUTE_SECRET: the API (it seals a
 * webhook's signing secret at creation, and its webhook dispatcher opens them to sign deliveries)
 * and the gateway (it opens the CA private key to sign node certificates). The worker does not.
 */
export const modesNeedingSecret: readonly ProcessMode[] = ['api', 'gateway', 'all'];

/**
 * The deployment secret, or an Error saying how to make one; `needs` names what needs it
 * (e.g. `mode api`). Call it before anything starts, so a process refuses to start without it.
 */
export function requireDeploymentSecret(
  config: Pick<Config, 'BETTER_COMPUTE_SECRET'>,
  needs: string,
): string {
  if (config.BETTER_COMPUTE_SECRET) return config.BETTER_COMPUTE_SECRET;
  throw new Error(
    `BETTER_COMPUTE_SECRET (the \`secret\` option) is not set, and ${needs} seals secrets at rest with it: ${deploymentSecretHint} and give every process of this deployment the same value`,
  );
}

/** Refuses to start `mode` without the deployment secret when it reads or writes sealed data. */
export function assertSecretForMode(config: Pick<Config, 'BETTER_COMPUTE_SECRET'>, mode: ProcessMode): void {
  if (modesNeedingSecret.includes(mode)) requireDeploymentSecret(config, `mode ${mode}`);
}

export function parseConfig(env: Record<string, string | undefined> = process.env): Config {
  const result = configSchema.safeParse(env);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    throw new Error(`configuration ${issue.path.join('.')} is invalid: ${issue.message}`);
  }
  return result.data;
}
