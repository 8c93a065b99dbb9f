import { assertNever, isErrorCode } from '../domain/errors.ts';
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
   * Retry calls that failed for a passing reason, with capped exponential back-off and jitter,
   * never waiting less than the server asks (`Retry-After` or `details.retryAfterSeconds`):
   * - RATE_LIMITED and UNAVAILABLE answers, and a connection that could not be opened, for every
   *   call: the server did not do the call (the limiter refuses before the handler runs; a
   *   transaction that failed changed nothing; only a COMMIT whose acknowledgement was lost with
   *   the database is in doubt, which keys and idempotent calls make harmless);
   * - a connection dropped after the request was sent (the answer is lost, the call may have been
   *   done), only for idempotent calls: their input carries an `idempotencyKey` (every create and
   *   extend), or the caller says so with `CallOptions.idempotent`.
   * `true` is `{ attempts: 5, baseDelayMs: 250, maxDelayMs: 30_000 }`. Off by default.
   */
  retry?: boolean | RetryPolicy;
  /** @deprecated Use `retry`; `true` is `retry: { attempts: 2 }` (one retry), as it always was. */
  retryOnRateLimit?: boolean | { maxDelayMs?: number };
  /** Extra headers sent with every call. */
  headers?: Record<string, string>;
}

/** How the client retries (see `TransportOptions.retry`). */
export interface RetryPolicy {
  /** Tries in all, the first one included (default 5). */
  attempts?: number;
  /** The first back-off, doubled on each retry (default 250 ms). */
  baseDelayMs?: number;
  /** The longest single wait, also capping what the server asks (default 30 s). */
  maxDelayMs?: number;
  /** Told before each wait (to say so in a CLI or a log). */
  onRetry?: (retry: RetryNotice) => void;
}

/** What `RetryPolicy.onRetry` is told: the call, why it failed, and how long until the next try. */
export interface RetryNotice {
  method: string;
  /** The try that failed (1 for the first). */
  attempt: number;
  attempts: number;
  delayMs: number;
  /** The error code of the answer, or `CONNECTION` when no answer came. */
  reason: string;
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

/** What the server asked to wait, in milliseconds (`details.retryAfterSeconds`, then `Retry-After`). */
function serverAskedMs(error: ComputeClientError, header: string | null): number | null {
  const fromDetails = error.details?.retryAfterSeconds;
  if (typeof fromDetails === 'number' && fromDetails >= 0) return fromDetails * 1000;
  const seconds = Number(header);
  if (header && Number.isFinite(seconds) && seconds >= 0) return seconds * 1000;
  return null;
}

/** Connection errors raised before the request left this process: the server never saw it. */
const notSentCodes = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
]);

function causeCode(error: unknown): string | undefined {
  for (let cause = error, depth = 0; cause && depth < 4; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    cause = (cause as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Why a try failed, as far as retrying goes. */
type Failure =
  | { kind: 'answer'; error: ComputeClientError; retryAfter: string | null }
  | { kind: 'not-sent' | 'in-doubt'; error: ComputeConnectionError };

type Policy = Required<Omit<RetryPolicy, 'onRetry'>> & Pick<RetryPolicy, 'onRetry'>;

function retryPolicy(options: TransportOptions): Policy | null {
  const defaults = { attempts: 5, baseDelayMs: 250, maxDelayMs: 30_000 };
  if (options.retry) return { ...defaults, ...(options.retry === true ? {} : options.retry) };
  const legacy = options.retryOnRateLimit;
  if (legacy) return { ...defaults, attempts: 2, ...(legacy === true ? {} : legacy) };
  return null;
}

/**
 * The wait before try `attempt + 1`: exponential from `baseDelayMs`, capped, with jitter (half to
 * all of it), and never less than the server asked (plus up to a fifth, so clients told the same
 * time do not all come back at once).
 */
function backoffMs(policy: Policy, attempt: number, askedMs: number | null): number {
  const exponential = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  const jittered = exponential * (0.5 + Math.random() * 0.5);
  const asked = askedMs === null ? 0 : askedMs * (1 + Math.random() * 0.2);
  return Math.min(policy.maxDelayMs, Math.max(jittered, asked));
}

function hasIdempotencyKey(input: unknown): boolean {
  return (
    typeof input === 'object' &&
    input !== null &&
    typeof (input as { idempotencyKey?: unknown }).idempotencyKey === 'string'
  );
}

/** Whether a failed try may be made again (see `TransportOptions.retry`). */
function retryable(failure: Failure, idempotent: boolean): boolean {
  switch (failure.kind) {
    case 'answer':
      return failure.error.code === 'RATE_LIMITED' || failure.error.code === 'UNAVAILABLE';
    case 'not-sent':
      return true;
    case 'in-doubt':
      return idempotent;
    default:
      return assertNever(failure);
  }
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
  const policy = retryPolicy(options);

  async function once(
    group: string,
    method: string,
    input: unknown,
    call: CallOptions,
  ): Promise<{ ok: true; data: unknown } | ({ ok: false } & Failure)> {
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
      const error = new ComputeConnectionError(
        `cannot reach the API at ${options.baseURL}${reason ? ` (${reason})` : ''}`,
        {
          url,
          cause,
        },
      );
      return { ok: false, kind: notSentCodes.has(causeCode(cause) ?? '') ? 'not-sent' : 'in-doubt', error };
    }
    const outcome = await readEnvelope(response, {
      baseURL: options.baseURL,
      url,
      method: `${group}.${method}`,
    });
    if ('data' in outcome) return { ok: true, data: outcome.data };
    if (outcome.error instanceof ComputeClientError) {
      return {
        ok: false,
        kind: 'answer',
        error: outcome.error,
        retryAfter: response.headers.get('retry-after'),
      };
    }
    // Something else answered (a proxy whose upstream is down, a wrong port): the call may or may
    // not have reached the API.
    return { ok: false, kind: 'in-doubt', error: outcome.error };
  }

  return async function call(group: string, method: string, input: unknown, callOptions: CallOptions = {}) {
    const idempotent = callOptions.idempotent ?? hasIdempotencyKey(input);
    for (let attempt = 1; ; attempt++) {
      const result = await once(group, method, input, callOptions);
      if (result.ok) return result.data;
      if (!policy || attempt >= policy.attempts || !retryable(result, idempotent)) throw result.error;
      const asked = result.kind === 'answer' ? serverAskedMs(result.error, result.retryAfter) : null;
      const delayMs = backoffMs(policy, attempt, asked);
      policy.onRetry?.({
        method: `${group}.${method}`,
        attempt,
        attempts: policy.attempts,
        delayMs,
        reason: result.kind === 'answer' ? result.error.code : 'CONNECTION',
      });
      await sleep(delayMs, callOptions.signal);
    }
  };
}

export type Transport = ReturnType<typeof createTransport>;
