import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { type ComputeClient, createComputeClient } from '../client/index.ts';
import { CliError, exitCodes } from './errors.ts';

/** Options every API command takes. */
export interface ConnectionOptions {
  url?: string;
  token?: string;
  json?: boolean;
  tenant?: string;
}

/** What the dev stack writes to `.data/dev.json` (`npm run dev`). */
interface DevStackFile {
  apiUrl?: string;
  temporalUiUrl?: string | null;
  tenants?: Record<string, { id: string; token: string } | undefined>;
}

/** Where the dev stack's file is: BETTER_COMPUTE_DATA_DIR or `.data`, from the working directory. */
export function devStackFile(env: NodeJS.ProcessEnv = process.env): string {
  return path.resolve(env.BETTER_COMPUTE_DATA_DIR ?? '.data', 'dev.json');
}

function readDevStack(file: string): DevStackFile | null {
  if (!existsSync(file)) return null;
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as DevStackFile;
  } catch {
    throw new CliError(`${file} is not valid JSON: restart the dev stack (\`npm run dev\`) to rewrite it`);
  }
}

export interface ResolvedConnection {
  url: string;
  token: string;
  source: { url: 'flag' | 'env' | 'dev-stack'; token: 'flag' | 'env' | 'dev-stack' };
}

/**
 * The API URL and token, from the flags, then BETTER_COMPUTE_URL / BETTER_COMPUTE_TOKEN, then the
 * dev stack's `.data/dev.json` (its API URL, and the token of `--tenant` or else the root's).
 */
export function resolveConnection(
  options: ConnectionOptions,
  env: NodeJS.ProcessEnv = process.env,
): ResolvedConnection {
  const dev = readDevStack(devStackFile(env));
  const urlFrom = options.url ? 'flag' : env.BETTER_COMPUTE_URL ? 'env' : dev?.apiUrl ? 'dev-stack' : null;
  const url = options.url ?? env.BETTER_COMPUTE_URL ?? dev?.apiUrl;
  if (!url || !urlFrom) {
    throw new CliError(
      'no API URL: pass --url, set BETTER_COMPUTE_URL, or start the dev stack with `npm run dev`',
      exitCodes.usage,
    );
  }
  if (!URL.canParse(url) || !/^https?:$/.test(new URL(url).protocol)) {
    throw new CliError(`--url must be an http(s) URL such as http://127.0.0.1:7070, got '${url}'`);
  }
  const devToken = dev?.tenants?.[options.tenant ?? 'root']?.token ?? dev?.tenants?.root?.token;
  const tokenFrom = options.token ? 'flag' : env.BETTER_COMPUTE_TOKEN ? 'env' : devToken ? 'dev-stack' : null;
  const token = options.token ?? env.BETTER_COMPUTE_TOKEN ?? devToken;
  if (!token || !tokenFrom) {
    throw new CliError(
      'no API token: pass --token or set BETTER_COMPUTE_TOKEN (an administrator mints one with `better-compute tokens create`)',
      exitCodes.credential,
    );
  }
  return { url, token, source: { url: urlFrom, token: tokenFrom } };
}

/**
 * The typed client for a command's options. It retries what is safe to retry (RATE_LIMITED and
 * UNAVAILABLE answers, an API that is restarting) with back-off, saying so on stderr.
 */
export function clientFor(options: ConnectionOptions, env: NodeJS.ProcessEnv = process.env): ComputeClient {
  const connection = resolveConnection(options, env);
  return createComputeClient({
    baseURL: connection.url,
    token: connection.token,
    retry: {
      attempts: 6,
      onRetry: (r) =>
        process.stderr.write(
          `better-compute: ${r.method} ${r.reason === 'CONNECTION' ? 'could not reach the API' : `answered ${r.reason}`}; retrying in ${(r.delayMs / 1000).toFixed(1)} s (${r.attempt}/${r.attempts - 1})\n`,
        ),
    },
  });
}

/**
 * The Temporal Web UI's URL: --temporal-ui, BETTER_COMPUTE_TEMPORAL_UI, or the dev stack's; null
 * when none is known.
 */
export function temporalUiUrl(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string | null {
  return flag ?? env.BETTER_COMPUTE_TEMPORAL_UI ?? readDevStack(devStackFile(env))?.temporalUiUrl ?? null;
}
