/** Request-scoped values, in one typed Hono Env. */
export interface ApiEnv {
  Variables: { requestId: string };
}
