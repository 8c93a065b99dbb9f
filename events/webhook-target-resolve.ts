import { lookup } from 'node:dns/promises';
import { ComputeError } from '../domain/errors.ts';
import {
  ipLiteralHost,
  isAllowlistedTarget,
  nonPublicAddress,
  type WebhookAllowedHost,
  webhookUrlRefusal,
} from '../domain/webhook-target.ts';

export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/** Every address a host name resolves to. The dispatcher takes one as a dependency (tests inject one). */
export type HostResolver = (hostname: string) => Promise<ResolvedAddress[]>;

/** The system's resolver (getaddrinfo: /etc/hosts, then DNS), every address in the order it gives. */
export const systemResolver: HostResolver = async (hostname) =>
  (await lookup(hostname, { all: true, verbatim: true })).map((a) => ({
    address: a.address,
    family: a.family === 6 ? 6 : 4,
  }));

/** Where a delivery may go: the one address that was checked, to connect to and nothing else. */
export type WebhookTargetDecision =
  | { ok: true; url: URL; address: ResolvedAddress }
  | { ok: false; reason: 'refused-target' | 'connection-failed'; detail: string };

/**
 * Decides a delivery's target just before it is sent: the URL's rules (https, a public literal
 * address; http and any address only for an allowlisted host), then every address the name
 * resolves to must be public. The caller connects to the answered address only (pinned), so a
 * name that resolves differently a moment later (DNS rebinding) cannot move the request.
 */
export async function decideWebhookTarget(
  rawUrl: string,
  allowHosts: readonly WebhookAllowedHost[],
  resolve: HostResolver,
): Promise<WebhookTargetDecision> {
  if (!URL.canParse(rawUrl)) return { ok: false, reason: 'refused-target', detail: 'not a URL' };
  if (!URL.canParse(rawUrl)) {
    throw new ComputeError('INVALID_INPUT', `url: '${rawUrl.slice(0, 200)}' is not a URL`, { field: 'url' });
  }
  const url = new URL(rawUrl);
  const refusal = webhookUrlRefusal(url, allowHosts);
  if (refusal) return { ok: false, reason: 'refused-target', detail: refusal };
  const literal = ipLiteralHost(url);
  if (literal !== null) {
    return { ok: true, url, address: { address: literal, family: literal.includes(':') ? 6 : 4 } };
  }
  let addresses: ResolvedAddress[];
  try {
    addresses = await resolve(url.hostname);
  } catch {
    return { ok: false, reason: 'connection-failed', detail: `${url.hostname} does not resolve` };
  }
  if (addresses.length === 0) {
    return { ok: false, reason: 'connection-failed', detail: `${url.hostname} does not resolve` };
  }
  if (!isAllowlistedTarget(url, allowHosts)) {
    for (const { address } of addresses) {
      const refused = nonPublicAddress(address);
      if (refused) {
        const detail = `${url.hostname} resolves to ${refused.address}, ${refused.kind}`;
        return { ok: false, reason: 'refused-target', detail };
      }
    }
  }
  return { ok: true, url, address: addresses[0]! };
}

const howToFix =
  'webhooks reach only public https endpoints (in development, list the host in BETTER_COMPUTE_WEBHOOK_ALLOW_HOSTS)';

/**
 * The check at `webhooks.create`: INVALID_INPUT, saying why and what to do, for a URL that is not
 * https, or whose literal address or any resolved address is not public. A name that does not
 * resolve within `timeoutMs` is accepted: every delivery checks it again after resolving it.
 */
export async function assertWebhookTargetAccepted(
  rawUrl: string,
  allowHosts: readonly WebhookAllowedHost[],
  resolve: HostResolver,
  timeoutMs = 2000,
): Promise<void> {
  if (!URL.canParse(rawUrl)) {
    throw new ComputeError('INVALID_INPUT', `url: '${rawUrl.slice(0, 200)}' is not a URL`, { field: 'url' });
  }
  const url = new URL(rawUrl);
  const refusal = webhookUrlRefusal(url, allowHosts);
  if (refusal) throw new ComputeError('INVALID_INPUT', `url: ${refusal}; ${howToFix}`, { field: 'url' });
  if (isAllowlistedTarget(url, allowHosts) || ipLiteralHost(url) !== null) return;
  let timer: NodeJS.Timeout | undefined;
  const addresses = await Promise.race([
    resolve(url.hostname).catch(() => [] as ResolvedAddress[]),
    // wall time: a bound on how long the API call waits for DNS
    new Promise<ResolvedAddress[]>((done) => {
      timer = setTimeout(() => done([]), timeoutMs);
    }),
  ]).finally(() => clearTimeout(timer));
  for (const { address } of addresses) {
    const refused = nonPublicAddress(address);
    if (refused) {
      throw new ComputeError(
        'INVALID_INPUT',
        `url: ${url.hostname} resolves to ${refused.address}, ${refused.kind}; ${howToFix}`,
        { field: 'url' },
      );
    }
  }
}
