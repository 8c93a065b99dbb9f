import path from 'node:path';
import { z } from 'zod';

/**
 * bcd's configuration: flags win over BCD_* environment variables, which win over defaults. This
 * is the only place in the daemon that reads the environment.
 */
export const daemonConfigSchema = z.object({
  dir: z.string().min(1),
  gateway: z.string().min(1).optional(),
  cdiDir: z.string().min(1),
  envDir: z.string().min(1),
  /** The kubelet's device-plugin directory; set, bcd serves `kubernetes` bindings as a device plugin. */
  kubeletDir: z.string().min(1).optional(),
  logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
  /** `bcd site`: BMC commands run at once for different machines (each machine's in order). */
  bmcConcurrency: z.coerce.number().int().min(1).max(1024).default(16),
});
export type DaemonConfig = z.infer<typeof daemonConfigSchema>;

export function parseDaemonConfig(
  flags: {
    dir?: string;
    gateway?: string;
    root?: string;
    cdiDir?: string;
    envDir?: string;
    kubeletDir?: string;
    logLevel?: string;
    bmcConcurrency?: string;
  },
  env: Record<string, string | undefined> = process.env,
): DaemonConfig {
  const dir = flags.dir ?? env.BCD_DIR ?? '/var/lib/bcd';
  const root = flags.root ?? env.BCD_ROOT;
  const result = daemonConfigSchema.safeParse({
    dir,
    gateway: flags.gateway ?? env.BCD_GATEWAY,
    cdiDir: flags.cdiDir ?? env.BCD_CDI_DIR ?? (root ? path.join(root, 'etc/cdi') : '/etc/cdi'),
    envDir:
      flags.envDir ??
      env.BCD_ENV_DIR ??
      (root ? path.join(root, 'run/bcd/allocations') : '/run/bcd/allocations'),
    kubeletDir: flags.kubeletDir ?? env.BCD_KUBELET_DIR,
    logLevel: flags.logLevel ?? env.BCD_LOG_LEVEL ?? 'info',
    bmcConcurrency: flags.bmcConcurrency ?? env.BCD_BMC_CONCURRENCY,
  });
  if (!result.success) {
    const issue = result.error.issues[0]!;
    throw new Error(`bcd configuration ${issue.path.join('.')} is invalid: ${issue.message}`);
  }
  return result.data;
}
