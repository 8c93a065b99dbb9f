import type { Principal } from '../core/iam-port.ts';
import type { MethodDefinition } from './method.ts';

/** Request-scoped values, in one typed Hono Env. */
export interface ApiEnv {
  Variables: {
    requestId: string;
    /** Set on a method call once its route names a method of the registry. */
    method: MethodDefinition;
    /** Set on a method call once it is authenticated. */
    principal: Principal;
  };
}
