import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import type { WebhookFailureReason } from '../domain/webhook-target.ts';
import type { ResolvedAddress } from './webhook-target-resolve.ts';

export type WebhookPostOutcome =
  | { answered: true; statusCode: number }
  | {
      answered: false;
      reason: Extract<WebhookFailureReason, 'timeout' | 'connection-failed' | 'tls-failed'>;
    };

export interface WebhookPost {
  url: URL;
  /** The address that was checked: the connection goes there and nowhere else. */
  address: ResolvedAddress;
  headers: Record<string, string>;
  body: string;
  timeoutMs: number;
  /** Cuts the request off (the dispatcher stopping). */
  signal: AbortSignal;
}

/**
 * POSTs one delivery to a pinned address: the TCP connection is made to `address` whatever the
 * host name resolves to now (TLS still verifies the certificate against the URL's host name), on
 * a fresh connection (no pooled socket to an earlier address). Redirects are never followed: a
 * 3xx is an answer like any other. Failures come back as a closed reason, never the OS message.
 */
export function postWebhook(post: WebhookPost): Promise<WebhookPostOutcome> {
  const secure = post.url.protocol === 'https:';
  const pinned = post.address;
  const lookup: LookupFunction = (_hostname, options, callback) => {
    if (options.all) callback(null, [pinned]);
    else callback(null, pinned.address, pinned.family);
  };
  return new Promise((resolve) => {
    let settled = false;
    let timedOut = false;
    let connected = false;
    let secured = false;
    const settle = (outcome: WebhookPostOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      post.signal.removeEventListener('abort', onStop);
      resolve(outcome);
    };
    const request = (secure ? https : http).request(post.url, {
      method: 'POST',
      headers: { ...post.headers, 'content-length': String(Buffer.byteLength(post.body)) },
      lookup,
      agent: false,
    });
    // A timer of our own covers the connection, the TLS handshake and the wait for the status line.
    const timer = setTimeout(() => {
      timedOut = true;
      request.destroy();
    }, post.timeoutMs);
    const onStop = () => request.destroy();
    post.signal.addEventListener('abort', onStop, { once: true });
    if (post.signal.aborted) request.destroy();
    request.on('socket', (socket) => {
      socket.once('connect', () => {
        connected = true;
      });
      socket.once('secureConnect', () => {
        secured = true;
      });
    });
    request.on('response', (response) => {
      const statusCode = response.statusCode ?? 0;
      // The body is not read: the status is the answer, and the connection is not reused.
      response.destroy();
      settle({ answered: true, statusCode });
    });
    request.on('error', () => {
      if (timedOut) return settle({ answered: false, reason: 'timeout' });
      // Told apart by how far the connection got, never by the error's text.
      const tlsFailed = secure && connected && !secured;
      settle({ answered: false, reason: tlsFailed ? 'tls-failed' : 'connection-failed' });
    });
    request.on('close', () => {
      if (timedOut) settle({ answered: false, reason: 'timeout' });
      else settle({ answered: false, reason: 'connection-failed' });
    });
    request.end(post.body);
  });
}
