/**
 * The typed client (`better-compute/client`): `createComputeClient<typeof compute>({ baseURL, token })`
 * gives `client.{group}.{method}(input, { signal })` with every input and output type inferred from
 * the server's zod schemas. At run time it loads only `client/` and `domain/` (the error table, the
 * protocol header): no server module, no database or Temporal package (tests/client/bundle.test.ts).
 */
import type { Compute } from '../server/compute.ts';
import { ComputeConnectionError } from './errors.ts';
import { type ComputeEvent, type StreamOptions, streamEvents } from './events.ts';
import { createTransport, readEnvelope, type TransportOptions } from './transport.ts';
import type { CallOptions, ClientMethods, RegistryOf } from './types.ts';

export { type ErrorCode, errorCodes, isErrorCode } from '../domain/errors.ts';
export type { EventType } from '../domain/event-types.ts';
export { ComputeClientError, ComputeConnectionError, isComputeClientError } from './errors.ts';
export type { ComputeEvent, StreamOptions } from './events.ts';
export { type Hold, type WithHoldOptions, withHold } from './holds.ts';
export { parseSse, type SseFrame } from './sse.ts';
export type { RetryNotice, RetryPolicy, TokenSource, TransportOptions } from './transport.ts';
export type { CallOptions, ClientMethods, MethodInput, MethodOutput, RegistryOf } from './types.ts';

export type ComputeClientOptions = TransportOptions;

/** What the client adds beside the methods; `$`-prefixed so no API group can collide with it. */
export interface ComputeClientExtras {
  /** Follows the event stream (resuming after reconnects without loss or repeats). */
  $stream(options?: StreamOptions): AsyncGenerator<ComputeEvent>;
  /** Calls `group.method` by name (for generic callers such as the CLI's `--query`). */
  $call(group: string, method: string, input?: unknown, options?: CallOptions): Promise<unknown>;
  readonly $baseURL: string;
}

export type ComputeClient<T = Compute> = ClientMethods<RegistryOf<T>> & ComputeClientExtras;

/**
 * Creates a client for the API at `baseURL`. `token` is a string or a function returning the
 * current one. Errors are `ComputeClientError` (the API refused: `code`, `details`, `requestId`,
 * `status`) or `ComputeConnectionError` (no answer from the API).
 */
export function createComputeClient<T = Compute>(options: ComputeClientOptions): ComputeClient<T> {
  const call = createTransport(options);
  const doFetch = options.fetch ?? globalThis.fetch;
  const extras: ComputeClientExtras = {
    $baseURL: options.baseURL,
    $call: (group, method, input, callOptions) => call(group, method, input, callOptions ?? {}),
    $stream: (streamOptions) =>
      streamEvents(
        {
          baseURL: options.baseURL,
          token: options.token,
          fetch: doFetch,
          toError: async (response, method) => {
            const outcome = await readEnvelope(response, {
              baseURL: options.baseURL,
              url: response.url,
              method,
            });
            return 'error' in outcome
              ? outcome.error
              : new ComputeConnectionError(`unexpected answer from ${options.baseURL}`, {
                  url: response.url,
                });
          },
        },
        streamOptions,
      ),
  };
  const groups = new Map<string, unknown>();
  return new Proxy(extras, {
    get(target, property, receiver) {
      if (typeof property !== 'string' || property.startsWith('$') || property === 'then') {
        return Reflect.get(target, property, receiver);
      }
      let group = groups.get(property);
      if (!group) {
        const methods = new Map<string, unknown>();
        group = new Proxy(
          {},
          {
            get(_, name) {
              if (typeof name !== 'string' || name === 'then') return undefined;
              let fn = methods.get(name);
              if (!fn) {
                fn = (input?: unknown, callOptions?: { signal?: AbortSignal; requestId?: string }) =>
                  call(property, name, input, callOptions ?? {});
                methods.set(name, fn);
              }
              return fn;
            },
          },
        );
        groups.set(property, group);
      }
      return group;
    },
  }) as ComputeClient<T>;
}
