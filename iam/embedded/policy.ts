import type { Condition, PolicyStatement } from '../../core/iam-policy.ts';
import { assertNever } from '../../domain/errors.ts';
import type { IamAction } from '../../domain/iam-actions.ts';

// How the embedded IAM evaluates the policy language (its documents' schema: core/iam-policy.ts).

/** Whether `pattern` (`compute:*`, `compute:reservations:*`, an exact action) covers `action`. */
export function actionMatches(pattern: string, action: IamAction): boolean {
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
    default:
      return assertNever(condition.operator);
  }
}

/** Whether a statement covers this action, resource type and principal (its condition aside). */
export function statementApplies(
  statement: PolicyStatement,
  action: IamAction,
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
