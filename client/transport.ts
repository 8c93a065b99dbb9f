import { isErrorCode } from '../domain/errors.ts';
import { requiredHeader } from '../domain/http-protocol.ts';
import { ComputeClientError, ComputeConnectionError } from './errors.ts';
import type { CallOptions } from './types.ts';

/** A token, or a function returning the current one (a session that refreshes it). */
export type TokenSource = string | (() => string | undefined | Promise<string | undefined>);

export interface TransportOptions {
  /** Where the API is served, e.g. `https://compute.example.com` or `http://127.0.0.1:7070`. */
  baseURL: string;
  token?: TokenSource;
  /** Defaults to the global fetch. */
  fetch?: typeof fetch;
  /**
   * Retry once after RATE_LIMITED, waiting what the server asks (`Retry-After` or
   * `details.retryAfterSeconds`, 1 s when it says nothing) up to `maxDelayMs` (default 30 s).
   */
  retryOnRateLimit?: boolean | { maxDelayMs?: number };
  /** Extra headers sent with every call. */
  headers?: Record<string, string>;
}

/** `baseURL` joined with an API path, tolerating a trailing slash. */
export function apiUrl(baseURL: string, path: string): string {
  return `${baseURL.replace(/\/+$/, '')}${path}`;
}

export async function resolveToken(token: TokenSource | undefined): Promise<string | undefined> {
  return typeof token === 'function' ? await token() : token;
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function retryDelayMs(error: ComputeClientError, header: string | null): number {
  const fromDetails = error.details?.retryAfterSeconds;
  if (typeof fromDetails === 'number' && fromDetails >= 0) return fromDetails * 1000;
  const seconds = Number(header);
  if (header && Number.isFinite(seconds) && seconds >= 0) return seconds * 1000;
  return 1000;
}

/**
 * Reads the API's envelope from a response: `{ data }`, or its `{ error }` as a ComputeClientError;
 * anything else (a proxy's page, another service) is a ComputeConnectionError.
 */
export async function readEnvelope(
  response: Response,
  where: { baseURL: string; url: string; method: string },
): Promise<{ data: unknown } | { error: ComputeClientError | ComputeConnectionError }> {
  let body: unknown;
  try {
    body = JSON.parse(await response.text());
  } catch {
    body = undefined;
  }
  if (body && typeof body === 'object') {
    if (response.ok && 'data' in body) return { data: (body as { data: unknown }).data };
    const error = (body as { error?: Record<string, unknown> }).error;
    if (error && isErrorCode(error.code)) {
      return {
        error: new ComputeClientError({
          code: error.code,
          message: typeof error.message === 'string' ? error.message : error.code,
          status: response.status,
          details: (error.details as Record<string, unknown> | undefined) ?? undefined,
          requestId:
            typeof error.requestId === 'string'
              ? error.requestId
              : (response.headers.get('x-request-id') ?? undefined),
          method: where.method,
        }),
      };
    }
  }
  return {
    error: new ComputeConnectionError(
      `the server at ${where.baseURL} answered HTTP ${response.status} without the Better Compute envelope: is that the API's URL?`,
      { url: where.url, status: response.status },
    ),
  };
}

/** Builds the one function every client method goes through: `POST {baseURL}/api/compute/{group}/{method}`. */
export function createTransport(options: TransportOptions) {
  const doFetch = options.fetch ?? globalThis.fetch;
  const retry = options.retryOnRateLimit;
  const maxDelayMs = typeof retry === 'object' ? (retry.maxDelayMs ?? 30_000) : 30_000;

  async function once(
    group: string,
    method: string,
    input: unknown,
    call: CallOptions,
  ): Promise<
    { ok: true; data: unknown } | { ok: false; error: ComputeClientError; retryAfter: string | null }
  > {
    const url = apiUrl(options.baseURL, `/api/compute/${group}/${method}`);
    const headers: Record<string, string> = {
      ...options.headers,
      'content-type': 'application/json',
      accept: 'application/json',
      [requiredHeader.name]: requiredHeader.value,
    };
    const token = await resolveToken(options.token);
    if (token) headers.authorization = `Bearer ${token}`;
    if (call.requestId) headers['x-request-id'] = call.requestId;
    let response: Response;
    try {
      response = await doFetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify(input ?? {}),
        ...(call.signal ? { signal: call.signal } : {}),
      });
    } catch (cause) {
      if (call.signal?.aborted) throw call.signal.reason;
      const reason =
        cause instanceof Error ? ((cause.cause as Error | undefined)?.message ?? cause.message) : '';
      throw new ComputeConnectionError(
        `cannot reach the API at ${options.baseURL}${reason ? ` (${reason})` : ''}`,
        {
          url,
          cause,
        },
      );
    }
    const outcome = await readEnvelope(response, {
      baseURL: options.baseURL,
      url,
      method: `${group}.${method}`,
    });
    if ('data' in outcome) return { ok: true, data: outcome.data };
    if (outcome.error instanceof ComputeClientError) {
      return { ok: false, error: outcome.error, retryAfter: response.headers.get('retry-after') };
    }
    throw outcome.error;
  }

  return async function call(group: string, method: string, input: unknown, callOptions: CallOptions = {}) {
    let result = await once(group, method, input, callOptions);
    if (!result.ok && retry && result.error.code === 'RATE_LIMITED') {
      await sleep(Math.min(retryDelayMs(result.error, result.retryAfter), maxDelayMs), callOptions.signal);
      result = await once(group, method, input, callOptions);
    }
    if (!result.ok) throw result.error;
    return result.data;
  };
}

export type Transport = ReturnType<typeof createTransport>;
