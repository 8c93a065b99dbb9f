import type { ColumnType, Generated } from 'kysely';

type TimestampDefault = ColumnType<Date, Date | string | undefined, Date | string>;
type Timestamp = ColumnType<Date, Date | string, Date | string>;

/** One webhook endpoint of a tenant (migration 2026-11-29T40-events-and-webhooks). */
export interface WebhookSubscriptionsTable {
  id: string;
  tenant_id: string;
  url: string;
  secret: string;
  event_types: ColumnType<string[], string[] | undefined, string[]>;
  description: Generated<string>;
  created_by: string | null;
  /** xid8 as text. */
  cursor_xid: ColumnType<string, string | undefined, string>;
  cursor_seq: ColumnType<string, string | number | undefined, string | number>;
  attempts: Generated<number>;
  next_attempt_at: Timestamp | null;
  lease_owner: string | null;
  lease_until: Timestamp | null;
  deleted_at: Timestamp | null;
  created_at: TimestampDefault;
  updated_at: TimestampDefault;
}

/** Every delivery attempt of an event to a webhook. */
export interface WebhookDeliveriesTable {
  id: string;
  subscription_id: string;
  event_id: string;
  event_seq: ColumnType<string, string | number, string | number>;
  event_type: string;
  attempt: number;
  outcome: 'succeeded' | 'retrying' | 'failed';
  status_code: number | null;
  error: string | null;
  duration_ms: number;
  created_at: TimestampDefault;
}

// Declaration merging keeps this area's tables beside its code.
declare module '../db/schema.ts' {
  interface Database {
    webhook_subscriptions: WebhookSubscriptionsTable;
    webhook_deliveries: WebhookDeliveriesTable;
  }
}
