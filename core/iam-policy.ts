import { z } from 'zod';

/**
 * The policy language: versioned JSON documents of statements. A statement names its effect,
 * the actions it covers (`compute:*` wildcards), optionally resource types and principals, and a
 * condition tree over the resource's attributes. Deny wins over allow; nothing allowed is denied.
 *
 * "At most 8 H100s for at most 72 hours in these regions", as one policy and no code:
 *
 * ```json
 * { "statements": [{ "sid": "BoundedH100", "effect": "deny",
 *     "actions": ["compute:reservations:create", "compute:reservations:extend"],
 *     "condition": { "all": [
 *       { "attribute": "gpuModel", "operator": "equals", "value": "h100" },
 *       { "not": { "all": [
 *         { "attribute": "gpuCount", "operator": "lessThanOrEqual", "value": 8 },
 *         { "attribute": "durationHours", "operator": "lessThanOrEqual", "value": 72 },
 *         { "attribute": "region", "operator": "in", "value": ["eu-central-1", "eu-west-1"] } ] } } ] } }] }
 * ```
 */
export const conditionOperators = [
  'equals',
  'notEquals',
  'in',
  'notIn',
  'lessThan',
  'lessThanOrEqual',
  'greaterThan',
  'greaterThanOrEqual',
  'exists',
  'startsWith',
] as const;
export type ConditionOperator = (typeof conditionOperators)[number];

export type Condition =
  | { all: Condition[] }
  | { any: Condition[] }
  | { not: Condition }
  | { attribute: string; operator: ConditionOperator; value?: unknown };

const scalar = z.union([z.string(), z.number(), z.boolean()]);

export const conditionSchema: z.ZodType<Condition> = z.lazy(() =>
  z.union([
    z.strictObject({ all: z.array(conditionSchema).min(1).max(50) }),
    z.strictObject({ any: z.array(conditionSchema).min(1).max(50) }),
    z.strictObject({ not: conditionSchema }),
    z.strictObject({
      attribute: z.string().min(1).max(100),
      operator: z.enum(conditionOperators),
      value: z.union([scalar, z.array(scalar).max(200)]).optional(),
    }),
  ]),
);

const actionPattern = z
  .string()
  .regex(
    /^(\*|compute:(\*|[a-z-]+:(\*|[a-z-]+)))$/,
    'an action such as compute:reservations:create or compute:*',
  );

export const statementSchema = z.strictObject({
  sid: z.string().min(1).max(100).optional(),
  effect: z.enum(['allow', 'deny']),
  actions: z.array(actionPattern).min(1).max(50),
  resourceTypes: z.array(z.string().min(1).max(100)).max(20).optional(),
  principals: z
    .strictObject({
      identityIds: z.array(z.string()).max(200).optional(),
      kinds: z.array(z.enum(['person', 'service', 'agent'])).optional(),
    })
    .optional(),
  condition: conditionSchema.optional(),
});

export const policyDocumentSchema = z.strictObject({
  description: z.string().max(1000).optional(),
  statements: z.array(statementSchema).min(1).max(100),
});

export type PolicyStatement = z.infer<typeof statementSchema>;
export type PolicyDocument = z.infer<typeof policyDocumentSchema>;
