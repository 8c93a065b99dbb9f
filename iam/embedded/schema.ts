import type { ColumnType, Generated } from 'kysely';

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
  kind: 'person' | 'service' | 'agent';
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

/** IAM's own tables, in the PostgreSQL schema `iam` (never mixed into compute's Database). */
export interface IamDatabase {
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
}
