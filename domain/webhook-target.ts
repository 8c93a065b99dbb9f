import ipaddr from 'ipaddr.js';
import { z } from 'zod';

/**
 * Why a webhook delivery failed, as the deliveries view shows it: a closed set, never an OS or TLS
 * message (those would tell a tenant what listens where inside the network: a port scanner).
 */
export const webhookFailureReasons = [
  /** No answer within the delivery deadline. */
  'timeout',
  /** No connection: refused, reset, unreachable, or the name did not resolve. */
  'connection-failed',
  /** The TLS handshake or the certificate check failed. */
  'tls-failed',
  /** The target is not allowed: not HTTPS, or it is (or resolves to) a non-public address. */
  'refused-target',
  /** The endpoint answered with a status other than 2xx (a 3xx too: redirects are never followed). */
  'http-error',
] as const;
export type WebhookFailureReason = (typeof webhookFailureReasons)[number];

/** What one delivery attempt came to: delivered, failed with attempts left, or failed for good. */
export const webhookDeliveryOutcomes = ['succeeded', 'retrying', 'failed'] as const;
export type WebhookDeliveryOutcome = (typeof webhookDeliveryOutcomes)[number];

const failureReasonSet: ReadonlySet<string> = new Set(webhookFailureReasons);

/**
 * The closed reason of a stored delivery error. Rows written before the reasons were closed held
 * free text; they read as the nearest reason, and `legacy` says their status code is not to be shown.
 */
export function storedFailureReason(stored: string | null): {
  reason: WebhookFailureReason | null;
  legacy: boolean;
} {
  if (stored === null) return { reason: null, legacy: false };
  if (failureReasonSet.has(stored)) return { reason: stored as WebhookFailureReason, legacy: false };
  if (/^HTTP \d+$/.test(stored)) return { reason: 'http-error', legacy: true };
  if (stored.startsWith('no answer within')) return { reason: 'timeout', legacy: true };
  return { reason: 'connection-failed', legacy: true };
}

/** One entry of the development allowlist: a host, and a port or any port (null). */
export interface WebhookAllowedHost {
  /** As a URL's `hostname` spells it: lower case, IPv6 in brackets (`[::1]`). */
  host: string;
  port: number | null;
}

/**
 * Parses `BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS`: comma-separated `host[:port]` entries (`localhost`,
 * `127.0.0.1:8080`, `[::1]`). Throws an Error naming the first bad entry.
 */
export function parseWebhookAllowHosts(text: string): WebhookAllowedHost[] {
  const entries: WebhookAllowedHost[] = [];
  for (const raw of text.split(',')) {
    const entry = raw.trim();
    if (entry === '') continue;
    const url =
      /[/?#@\s]/.test(entry) || !URL.canParse(`http://${entry}`) ? null : new URL(`http://${entry}`);
    if (!url || url.hostname === '') {
      throw new Error(`'${entry}' is not a host or host:port (for example localhost, 127.0.0.1:8080, [::1])`);
    }
    entries.push({ host: url.hostname, port: url.port === '' ? null : Number(url.port) });
  }
  return entries;
}

/** The config setting: the allowlist's text, parsed once at start (a bad entry stops the process). */
export const webhookAllowHostsSetting = z.string().transform((text, ctx) => {
  try {
    return parseWebhookAllowHosts(text);
  } catch (error) {
    ctx.addIssue({ code: 'custom', message: (error as Error).message });
    return z.NEVER;
  }
});

/** What the dev stack allows when the setting is absent: this machine, over http, on any port. */
export const devWebhookAllowHosts: readonly WebhookAllowedHost[] =
  parseWebhookAllowHosts('localhost,127.0.0.1,[::1]');

function effectivePort(url: URL): number {
  if (url.port !== '') return Number(url.port);
  return url.protocol === 'https:' ? 443 : 80;
}

/** Whether the URL's host (and port) is on the development allowlist: then http and any address pass. */
export function isAllowlistedTarget(url: URL, allowHosts: readonly WebhookAllowedHost[]): boolean {
  const port = effectivePort(url);
  return allowHosts.some(
    (entry) => entry.host === url.hostname && (entry.port === null || entry.port === port),
  );
}

/** The URL's host when it is an IP address literal (without IPv6 brackets), else null. */
export function ipLiteralHost(url: URL): string | null {
  const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
  return ipaddr.isValid(host) ? host : null;
}

/**
 * Why a webhook may not be delivered to this IP address, or null when it may: only global unicast
 * addresses pass. Refused: loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
 * (169.254/16 with the cloud metadata address, fe80::/10), unspecified (0.0.0.0/8, ::), carrier-
 * grade NAT (100.64/10), multicast, broadcast, reserved and documentation ranges, and the IPv6
 * forms that carry an IPv4 address (mapped `::ffff:a.b.c.d`, NAT64, 6to4, Teredo). A mapped address
 * is judged as the IPv4 address it carries. ipaddr.js classifies; no CIDR arithmetic here.
 * Answers the address as judged and what it is (`a loopback address`).
 */
export function nonPublicAddress(address: string): { address: string; kind: string } | null {
  if (!ipaddr.isValid(address)) return { address, kind: 'not an IP address' };
  const parsed = ipaddr.process(address);
  const range = parsed.range();
  if (range === 'unicast') return null;
  return { address: parsed.toString(), kind: `${rangeNames[range] ?? `a ${range}`} address` };
}

/** `127.0.0.1 is a loopback address`, or null for a public address (see nonPublicAddress). */
export function addressRefusal(address: string): string | null {
  const found = nonPublicAddress(address);
  return found && `${found.address} is ${found.kind}`;
}

const rangeNames: Record<string, string> = {
  loopback: 'a loopback',
  private: 'a private',
  uniqueLocal: 'a private (unique local)',
  linkLocal: 'a link-local',
  unspecified: 'an unspecified',
  carrierGradeNat: 'a carrier-grade NAT',
  multicast: 'a multicast',
  broadcast: 'the broadcast',
  reserved: 'a reserved',
  rfc6052: 'a NAT64',
  '6to4': 'a 6to4',
  teredo: 'a Teredo',
};

/**
 * Why a webhook URL is refused before any name is resolved, or null: it must be https (http only
 * for a host on the development allowlist), and a literal IP address must be a public one (any
 * address for an allowlisted host). A host name is judged again once resolved (every address).
 */
export function webhookUrlRefusal(url: URL, allowHosts: readonly WebhookAllowedHost[]): string | null {
  if (url.protocol !== 'https:' && url.protocol !== 'http:') return `${url.protocol} is not http(s)`;
  if (isAllowlistedTarget(url, allowHosts)) return null;
  if (url.protocol !== 'https:') return `${url.host} is plain http, not https`;
  const literal = ipLiteralHost(url);
  return literal === null ? null : addressRefusal(literal);
}
