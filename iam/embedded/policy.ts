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

/** Whether `pattern` (`compute:*`, `compute:reservations:*`, an exact action) covers `action`. */
export function actionMatches(pattern: string, action: string): boolean {
  if (pattern === '*' || pattern === action) return true;
  if (pattern.endsWith(':*')) return action.startsWith(pattern.slice(0, -1));
  return false;
}

/** What a condition can read: `gpuCount` (a resource attribute), `resource.tenantId`, `principal.kind`. */
export interface EvaluationInput {
  attributes: Record<string, unknown>;
  resource: Record<string, unknown>;
  principal: Record<string, unknown>;
}

function read(input: EvaluationInput, path: string): unknown {
  if (path.startsWith('resource.')) return input.resource[path.slice(9)];
  if (path.startsWith('principal.')) return input.principal[path.slice(10)];
  return input.attributes[path];
}

function compare(a: unknown, b: unknown): number | null {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  if (typeof a === 'string' && typeof b === 'string') return a < b ? -1 : a > b ? 1 : 0;
  return null;
}

/** Evaluates a condition tree; a missing attribute makes every comparison false (so `not` flips it). */
export function evaluateCondition(condition: Condition, input: EvaluationInput): boolean {
  if ('all' in condition) return condition.all.every((c) => evaluateCondition(c, input));
  if ('any' in condition) return condition.any.some((c) => evaluateCondition(c, input));
  if ('not' in condition) return !evaluateCondition(condition.not, input);
  const actual = read(input, condition.attribute);
  const expected = condition.value;
  switch (condition.operator) {
    case 'exists':
      return actual !== undefined && actual !== null;
    case 'equals':
      return actual !== undefined && actual === expected;
    case 'notEquals':
      return actual !== undefined && actual !== expected;
    case 'in':
      return Array.isArray(expected) && actual !== undefined && expected.includes(actual as never);
    case 'notIn':
      return Array.isArray(expected) && actual !== undefined && !expected.includes(actual as never);
    case 'startsWith':
      return typeof actual === 'string' && typeof expected === 'string' && actual.startsWith(expected);
    case 'lessThan':
    case 'lessThanOrEqual':
    case 'greaterThan':
    case 'greaterThanOrEqual': {
      const order = compare(actual, expected);
      if (order === null) return false;
      if (condition.operator === 'lessThan') return order < 0;
      if (condition.operator === 'lessThanOrEqual') return order <= 0;
      if (condition.operator === 'greaterThan') return order > 0;
      return order >= 0;
    }
  }
}

/** Whether a statement covers this action, resource type and principal (its condition aside). */
export function statementApplies(
  statement: PolicyStatement,
  action: string,
  resourceType: string,
  principal: { identityId: string; kind: string },
): boolean {
  if (!statement.actions.some((p) => actionMatches(p, action))) return false;
  if (statement.resourceTypes && !statement.resourceTypes.includes(resourceType)) return false;
  const who = statement.principals;
  if (who?.identityIds && !who.identityIds.includes(principal.identityId)) return false;
  if (who?.kinds && !who.kinds.includes(principal.kind as 'person')) return false;
  return true;
}
