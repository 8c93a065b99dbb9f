/**
 * `better-compute`: the embeddable control plane. `betterCompute(options)` builds it in your own
 * process on your own PostgreSQL (and Temporal), returning `api`, `handler`, `initialize`, `start`
 * and `stop`. The typed client is `better-compute/client`; webhook signatures are
 * `better-compute/webhooks`.
 */
export type { Credential, ServerApi } from './api/method.ts';
export type { ProcessMode } from './core/config.ts';
export type { Logger } from './core/logger.ts';
export { ComputeError, type ErrorCode, errorCodes, isComputeError } from './domain/errors.ts';
export {
  type BetterCompute,
  type BetterComputeOptions,
  betterCompute,
  type InitializeResult,
} from './server/embed.ts';
