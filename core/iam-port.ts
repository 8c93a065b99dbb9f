import type { IamAction } from '../domain/iam-actions.ts';
import type { PolicyDocument } from './iam-policy.ts';

/**
 * The one interface compute calls for every IAM question (DESIGN.md, "iam"). The embedded
 * implementation is in iam/embedded/; a bridge to the real better-iam package can replace it
 * without touching callers. IAM is never called inside a compute transaction, and fleet paths
 * never call it.
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
  /**
   * The hash of the exact request the decision admits (a reservation's stored request hash, an
   * extend's request hash). A delegated approval admits only the request it was asked for, once.
   */
  requestHash?: string;
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
  /**
   * A bearer token to its principal; UNAUTHENTICATED when unknown, revoked or expired, or when the
   * delegation an agent's token acts under was revoked (never a direct session instead).
   */
  authenticate(credential: { token: string }): Promise<Principal>;
  /**
   * The decision of a mutation (or a read): throws ACCESS_DENIED, whose message names the action
   * and resource type and what to ask for, never another tenant's policies or identities; or
   * CONFIRMATION_REQUIRED for a delegated agent held for its person (an approval admits the request
   * of `context.requestHash` once); or UNAUTHENTICATED when the principal's delegation was revoked.
   */
  require(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<void>;
  authorize(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<Decision>;
  authorizeMany(
    principal: Principal,
    checks: ReadonlyArray<{ action: IamAction; resource: ResourceRef }>,
    context?: DecisionContext,
  ): Promise<Decision[]>;
  /**
   * Opens (or returns the open) confirmation for an agent's refused action on this request
   * (`context.requestHash`); deadline ≤ 30 min.
   */
  requestConfirmation(
    principal: Principal,
    action: IamAction,
    resource: ResourceRef,
    context?: DecisionContext,
  ): Promise<Confirmation | null>;
  billingCheck(tenantId: string, meter?: string): Promise<BillingCheck>;
  recordUsage(records: readonly UsageRecord[]): Promise<void>;
  featureEnabled(tenantId: string, feature: string): Promise<boolean>;
  /**
   * IAM's own administration, when this IAM offers it through compute (the embedded one does). A
   * bridge to an IAM administered elsewhere omits it, and compute's admin methods answer
   * UNSUPPORTED.
   */
  readonly admin?: IamAdminPort;
}

/** What a tenant id looks like: 1 to 63 lower-case letters, digits, '-' or '_'. */
export const tenantIdPattern = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/** A tenant as the tree of tenants knows it. */
export interface TenantNode {
  id: string;
  name: string;
  parentId: string | null;
}

export interface TenantInfo extends TenantNode {
  createdAt: Date;
}

export interface IdentityInfo {
  id: string;
  tenantId: string;
  kind: IdentityKind;
  name: string;
  email: string | null;
  /** The delegation an agent acts under for its person, if any. */
  delegationId: string | null;
  createdAt: Date;
}

/** An API token without its secret. */
export interface TokenInfo {
  id: string;
  identityId: string;
  name: string;
  expiresAt: Date | null;
  revokedAt: Date | null;
  lastUsedAt: Date | null;
  createdAt: Date;
}

/** A role: built-in (no tenant) or a tenant's own, granting actions (`compute:*` patterns). */
export interface RoleInfo {
  id: string;
  tenantId: string | null;
  name: string;
  actions: string[];
}

export interface RoleBindingInfo {
  identityId: string;
  roleId: string;
  roleName: string;
  tenantId: string;
}

/** One version of a named policy. */
export interface PolicyVersion {
  id: string;
  tenantId: string;
  name: string;
  version: number;
  document: PolicyDocument;
}

/** A confirmation as the person it waits for lists it. */
export interface ConfirmationRequest {
  id: string;
  state: 'pending' | 'approved' | 'denied';
  action: string;
  resource: { type: string; id: string };
  agentIdentityId: string;
  expiresAt: Date;
}

export interface ConfirmationDecision {
  id: string;
  state: 'pending' | 'approved' | 'denied';
  resourceId: string;
  action: string;
}

export interface Budget {
  tenantId: string;
  /** A meter, or `*` for all meters. */
  meter: string;
  limit: number;
}

/**
 * IAM's administration: tenants, identities, tokens, roles and bindings, policies, a person's
 * answers to confirmations, budgets and feature flags. Every write is seen by the next decision.
 * Errors: NOT_FOUND for a tenant, identity, role or confirmation that does not exist; CONFLICT for
 * a name or id already taken; INVALID_INPUT for a malformed id or policy document; INVALID_STATE
 * for a confirmation already decided or expired.
 */
export interface IamAdminPort {
  /** Creates a tenant under `parentId` (default: the root). The first tenant ever is the root. */
  createTenant(input: { id?: string; name: string; parentId?: string | null }): Promise<TenantInfo>;
  listTenants(): Promise<TenantInfo[]>;
  getTenant(tenantId: string): Promise<TenantNode | undefined>;
  /** The root tenant (the platform), or null before bootstrap. */
  rootTenantId(): Promise<string | null>;
  /** An identity; an agent with `personIdentityId` gets a delegation from that person. */
  createIdentity(input: {
    tenantId: string;
    kind: IdentityKind;
    name: string;
    email?: string;
    personIdentityId?: string;
    confirmActions?: string[];
    /** Roles (by id or name, as bindRole takes them) bound on its tenant with it, all or nothing. */
    roles?: string[];
  }): Promise<IdentityInfo>;
  listIdentities(tenantId: string): Promise<IdentityInfo[]>;
  /** Mints an API token; its secret is in this answer only. */
  createToken(input: {
    identityId: string;
    name?: string;
    expiresInSeconds?: number;
  }): Promise<TokenInfo & { token: string }>;
  listTokens(filter: { identityId?: string; tenantId?: string }): Promise<TokenInfo[]>;
  /** Revokes a token; idempotent. */
  revokeToken(tokenId: string): Promise<{ id: string; revokedAt: Date }>;
  /**
   * Revokes an agent's delegation from its person; idempotent. The agent's tokens stop
   * authenticating (UNAUTHENTICATED), and no new token can be minted for it.
   */
  revokeDelegation(delegationId: string): Promise<{ id: string; agentIdentityId: string; revokedAt: Date }>;
  createRole(input: { tenantId: string; name: string; actions: string[] }): Promise<RoleInfo>;
  /** The built-in roles, and the tenant's own when `tenantId` is given (every role without it). */
  listRoles(tenantId?: string): Promise<RoleInfo[]>;
  /** Binds a role (by id, or by name: the tenant's own first, then a built-in) on a tenant. */
  bindRole(input: { identityId: string; role: string; tenantId?: string }): Promise<RoleBindingInfo>;
  /** Applies a policy document under `name`: a new version, in force from now on. */
  applyPolicy(input: {
    tenantId: string;
    name: string;
    document: unknown;
    createdBy?: string;
  }): Promise<PolicyVersion>;
  /** Every version of the tenant's policies, by name, newest version first. */
  listPolicies(tenantId: string): Promise<Array<PolicyVersion & { createdAt: Date }>>;
  /**
   * The person's answer to a pending confirmation; only the person it names may decide it, once
   * (INVALID_STATE when it is already decided or expired).
   */
  decideConfirmation(input: {
    confirmationId: string;
    personIdentityId: string;
    decision: 'approved' | 'denied';
  }): Promise<ConfirmationDecision>;
  /** The confirmations that wait (or waited) for this person, newest first (at most 100). */
  listConfirmations(personIdentityId: string): Promise<ConfirmationRequest[]>;
  setBudget(input: { tenantId: string; meter?: string; limit: number }): Promise<Budget>;
  setFeature(input: { tenantId: string; feature: string; enabled: boolean }): Promise<void>;
}
