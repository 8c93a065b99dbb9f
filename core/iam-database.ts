import type { ColumnType, Generated, Kysely, Transaction } from 'kysely';
import type { Database } from './database.ts';
import type { IdentityKind } from './iam-port.ts';

type Timestamp = ColumnType<Date, Date | string, Date | string>;
type TimestampDefault = ColumnType<Date, Date | string | undefined, Date | string>;
type Numeric = ColumnType<string, number | string, number | string>;
type Json<T = unknown> = ColumnType<T, string, string>;

export interface IamTenantsTable {
  id: string;
  name: string;
  parent_id: string | null;
  created_at: TimestampDefault;
}

export interface IamIdentitiesTable {
  id: string;
  tenant_id: string;
  kind: IdentityKind;
  name: string;
  email: string | null;
  disabled_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface IamDelegationsTable {
  id: string;
  agent_identity_id: string;
  person_identity_id: string;
  confirm_actions: ColumnType<string[], string[] | undefined, string[]>;
  revoked_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface IamTokensTable {
  id: string;
  identity_id: string;
  name: Generated<string>;
  secret_hash: string;
  delegation_id: string | null;
  expires_at: Timestamp | null;
  revoked_at: Timestamp | null;
  last_used_at: Timestamp | null;
  created_at: TimestampDefault;
}

export interface IamRolesTable {
  id: string;
  tenant_id: string | null;
  name: string;
  actions: ColumnType<string[], string[], string[]>;
  created_at: TimestampDefault;
}

export interface IamRoleBindingsTable {
  identity_id: string;
  role_id: string;
  tenant_id: string;
  created_at: TimestampDefault;
}

export interface IamPoliciesTable {
  id: string;
  tenant_id: string;
  name: string;
  version: number;
  /** A policy document as applied (core/iam-policy.ts); read back through its schema. */
  document: Json<unknown>;
  disabled: Generated<boolean>;
  created_by: string | null;
  created_at: TimestampDefault;
}

export interface IamConfirmationsTable {
  id: string;
  tenant_id: string;
  delegation_id: string;
  agent_identity_id: string;
  person_identity_id: string;
  action: string;
  resource_type: string;
  resource_id: string;
  state: Generated<'pending' | 'approved' | 'denied'>;
  expires_at: Timestamp;
  decided_at: Timestamp | null;
  created_at: TimestampDefault;
  /** The hash of the request the confirmation was asked for; an approval admits only that request. */
  request_hash: string | null;
  /** When an approval admitted its request: it admits nothing more. */
  used_at: Timestamp | null;
}

export interface IamUsageRecordsTable {
  idempotency_key: string;
  tenant_id: string;
  meter: string;
  quantity: Numeric;
  window_start: Timestamp;
  window_end: Timestamp;
  subject: string;
  recorded_at: TimestampDefault;
}

export interface IamBudgetsTable {
  tenant_id: string;
  meter: Generated<string>;
  limit_amount: Numeric;
  updated_at: TimestampDefault;
}

export interface IamFeatureFlagsTable {
  tenant_id: string;
  feature: string;
  enabled: boolean;
}

/**
 * The embedded IAM's own tables, in the PostgreSQL schema `iam` (never part of compute's
 * `Database`). A type alias, not an interface, so that Kysely's `withTables` accepts it.
 */
export type IamDatabase = {
  'iam.tenants': IamTenantsTable;
  'iam.identities': IamIdentitiesTable;
  'iam.delegations': IamDelegationsTable;
  'iam.tokens': IamTokensTable;
  'iam.roles': IamRolesTable;
  'iam.role_bindings': IamRoleBindingsTable;
  'iam.policies': IamPoliciesTable;
  'iam.confirmations': IamConfirmationsTable;
  'iam.usage_records': IamUsageRecordsTable;
  'iam.budgets': IamBudgetsTable;
  'iam.feature_flags': IamFeatureFlagsTable;
};

/** Compute's database seen with IAM's tables as well; made once by `iamDatabase` (db/iam/iam-db.ts). */
export type IamDb = Kysely<Database & IamDatabase>;
export type IamTransaction = Transaction<Database & IamDatabase>;
