/**
 * What every HTTP call to the API carries besides its body, shared by the server (api/app.ts
 * refuses a call without it) and the typed client (which sends it), so the two cannot drift.
 */

/**
 * The header every `POST /api/compute/{group}/{method}` must carry. A browser sends a custom header
 * only after a CORS preflight, so a form on another site cannot post to the API with a user's
 * cookies or credentials. A call without it is INVALID_INPUT.
 */
export const requiredHeader = { name: 'X-Better-Compute', value: '1' } as const;
