import type { z } from 'zod';
import type { Deps } from '../core/deps.ts';
import type { Principal } from '../core/iam-port.ts';
import type { Logger } from '../core/logger.ts';
import { ComputeError } from '../domain/errors.ts';
import type { IamAction } from '../domain/iam-actions.ts';

/** Everything a method handler may use for one call. */
export interface MethodContext {
  deps: Deps;
  principal: Principal;
  requestId: string;
  log: Logger;
  /** Aborted when the caller goes away (bounded waits honour it). */
  signal: AbortSignal;
}

/**
 * One API method: its zod schemas are the single source of the server type, the typed client,
 * the CLI's validation and the OpenAPI document.
 */
export interface MethodDefinition<I extends z.ZodType = z.ZodType, O extends z.ZodType = z.ZodType> {
  summary: string;
  /** The IAM action the method is decided on, for documentation (the handler decides). */
  action: IamAction | null;
  input: I;
  output: O;
  handler(ctx: MethodContext, input: z.output<I>): Promise<z.input<O>>;
}

export function defineMethod<I extends z.ZodType, O extends z.ZodType>(
  definition: MethodDefinition<I, O>,
): MethodDefinition<I, O> {
  return definition;
}

/** A group of methods: `POST /api/compute/{group}/{method}`. */
export type MethodGroup = Record<string, MethodDefinition>;
export type MethodRegistry = Record<string, MethodGroup>;

/**
 * The method `group.name` of `registry`, by own properties only: a name such as `constructor` or
 * `__proto__` never reaches the prototype chain. NOT_FOUND names what the group (or registry) has.
 */
export function findMethod(registry: MethodRegistry, group: string, name: string): MethodDefinition {
  const methods = Object.hasOwn(registry, group) ? registry[group] : undefined;
  if (!methods) {
    throw new ComputeError(
      'NOT_FOUND',
      `unknown method ${group}.${name}: the groups are ${Object.keys(registry).join(', ')}`,
    );
  }
  const method = Object.hasOwn(methods, name) ? methods[name] : undefined;
  if (!method) {
    throw new ComputeError(
      'NOT_FOUND',
      `unknown method ${group}.${name}: ${group} has ${Object.keys(methods).join(', ')}`,
    );
  }
  return method;
}

/** The caller's credential as the server-side API takes it. */
export type Credential = { headers: Headers | Record<string, string | undefined> } | { token: string };

/** `compute.api.{group}.{method}(credential, input)`, typed from the registry. */
export type ServerApi<R extends MethodRegistry> = {
  [G in keyof R]: {
    [M in keyof R[G]]: R[G][M] extends MethodDefinition<infer I, infer O>
      ? (credential: Credential, input: z.input<I>) => Promise<z.output<O>>
      : never;
  };
};
