/**
 * The one interface compute calls for every IAM question (DESIGN.md, "iam"). The embedded
 * implementation lives beside it; a bridge to the real better-iam package can replace it without
 * touching callers. IAM is never called inside a compute transaction, and fleet paths never call it.
 */

export type IdentityKind = 'person' | 'service' | 'agent';

/** Who is calling, as authentication established it. */
export interface Principal {
  identityId: string;
  tenantId: string;
  kind: IdentityKind;
  /** The API token that authenticated the call. */
  tokenId: string | null;
  /** `delegated` when an agent acts for a person under a delegation. */
  sessionKind: 'direct' | 'delegated';
  /** Set for an agent acting for a person. */
  delegation?: { delegationId: string; personIdentityId: string };
  /** True when the identity administers the root tenant (the platform). */
  rootAdmin: boolean;
}

/** What a decision is about: a compute resource with the attributes policies read. */
export interface ResourceRef {
  type: string;
  id: string;
  tenantId: string;
  ownerIdentityId?: string | null;
  parent?: { type: string; id: string } | null;
  attributes?: Record<string, unknown>;
}

export interface DecisionContext {
  requestId?: string;
}

export type Decision =
  | { allowed: true; policyIds: string[] }
  | { allowed: false; reason: string; policyIds: string[]; confirmation?: Confirmation };

export interface Confirmation {
  id: string;
  state: 'pending' | 'approved' | 'denied' | 'expired';
  action: string;
  resource: { type: string; id: string };
  agentIdentityId: string;
  personIdentityId: string;
  expiresAt: Date;
}

export interface BillingCheck {
  allowed: boolean;
  /** Remaining budget in the budget's unit, when a budget applies. */
  remaining?: number;
  reason?: string;
}

/** One usage record; `idempotencyKey` makes a retried send a no-op. */
export interface UsageRecord {
  idempotencyKey: string;
  tenantId: string;
  meter: string;
  quantity: number;
  windowStart: Date;
  windowEnd: Date;
  subject: string;
}

export interface IamPort {
  /** A bearer token to its principal; UNAUTHENTICATED when unknown, revoked or expired. */
  authenticate(credential: { token: string }): Promise<Principal>;
  /** Throws ACCESS_DENIED (or CONFIRMATION_REQUIRED for a delegated agent held for a person). */
  require(
    principal: Principal,
    action: string,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<void>;
  authorize(
    principal: Principal,
    action: string,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<Decision>;
  authorizeMany(
    principal: Principal,
    checks: ReadonlyArray<{ action: string; resource: ResourceRef }>,
    context?: DecisionContext,
  ): Promise<Decision[]>;
  /** Opens (or returns the open) confirmation for an agent's refused action; deadline ≤ 30 min. */
  requestConfirmation(
    principal: Principal,
    action: string,
    resource: ResourceRef,
  ): Promise<Confirmation | null>;
  billingCheck(tenantId: string, meter?: string): Promise<BillingCheck>;
  recordUsage(records: readonly UsageRecord[]): Promise<void>;
  featureEnabled(tenantId: string, feature: string): Promise<boolean>;
}
