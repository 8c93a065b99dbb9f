import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/**
 * Webhook signatures in the Standard Webhooks scheme (https://www.standardwebhooks.com): the
 * signed content is `{webhook-id}.{webhook-timestamp}.{body}`, signed with HMAC-SHA256 under the
 * subscription's secret (`whsec_` + base64 key), sent as `webhook-signature: v1,{base64}`. The
 * timestamp (Unix seconds) lets a receiver refuse replays older than its tolerance.
 */
export const signatureHeaders = {
  id: 'webhook-id',
  timestamp: 'webhook-timestamp',
  signature: 'webhook-signature',
} as const;

/** A new signing secret: `whsec_` and 32 random bytes in base64. */
export function newWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

function keyOf(secret: string): Buffer {
  return Buffer.from(secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret, 'base64');
}

/** `v1,{base64 HMAC-SHA256 of id.timestamp.body}`. */
export function signWebhook(secret: string, id: string, timestampSeconds: number, body: string): string {
  const mac = createHmac('sha256', keyOf(secret))
    .update(`${id}.${timestampSeconds}.${body}`)
    .digest('base64');
  return `v1,${mac}`;
}

/**
 * What a receiver runs: true when one of the (space-separated) signatures matches and the
 * timestamp is within `toleranceSeconds` (default 300) of `nowSeconds`.
 */
export function verifyWebhook(input: {
  secret: string;
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  nowSeconds: number;
  toleranceSeconds?: number;
}): boolean {
  const timestamp = Number(input.timestamp);
  if (!Number.isInteger(timestamp)) return false;
  if (Math.abs(input.nowSeconds - timestamp) > (input.toleranceSeconds ?? 300)) return false;
  const expected = Buffer.from(signWebhook(input.secret, input.id, timestamp, input.body));
  return input.signature.split(' ').some((candidate) => {
    const given = Buffer.from(candidate);
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
}
