import type { z } from 'zod';
import type { MethodDefinition, MethodRegistry } from '../api/method.ts';

/** Options every call takes beside its input. */
export interface CallOptions {
  /** Aborts the request; the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Sent as `x-request-id`, so the server's logs and the error's `requestId` match it. */
  requestId?: string;
  /**
   * Doing this call twice does what doing it once does, so a retry after a dropped connection is
   * safe (default: whether the input carries an `idempotencyKey`). See `TransportOptions.retry`.
   */
  idempotent?: boolean;
}

/** The registry behind a server type: `typeof compute` (from `createCompute`) or the registry itself. */
export type RegistryOf<T> = T extends { methods: infer R extends MethodRegistry }
  ? R
  : T extends MethodRegistry
    ? T
    : never;

/** A method whose input has no required field may be called without one. */
type ClientMethod<I extends z.ZodType, O extends z.ZodType> =
  // biome-ignore lint/complexity/noBannedTypes: `{} extends T` is the test for "T has no required key".
  {} extends z.input<I>
    ? (input?: z.input<I>, options?: CallOptions) => Promise<z.output<O>>
    : (input: z.input<I>, options?: CallOptions) => Promise<z.output<O>>;

/** `client.{group}.{method}(input, options?)`, every type inferred from the server's zod schemas. */
export type ClientMethods<R extends MethodRegistry> = {
  readonly [G in keyof R]: {
    readonly [M in keyof R[G]]: R[G][M] extends MethodDefinition<infer I, infer O>
      ? ClientMethod<I, O>
      : never;
  };
};

/** The input type of `group.method`, as the client sends it. */
export type MethodInput<R extends MethodRegistry, G extends keyof R, M extends keyof R[G]> =
  R[G][M] extends MethodDefinition<infer I, z.ZodType> ? z.input<I> : never;

/** The output type of `group.method`, as the client receives it. */
export type MethodOutput<R extends MethodRegistry, G extends keyof R, M extends keyof R[G]> =
  R[G][M] extends MethodDefinition<z.ZodType, infer O> ? z.output<O> : never;
