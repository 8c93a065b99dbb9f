import { isIP } from 'node:net';
import { checkServerIdentity, type PeerCertificate } from 'node:tls';
import { type ChannelCredentials, type ChannelOptions, credentials } from '@grpc/grpc-js';

/**
 * The TLS server name sent when the gateway is dialled by IP address: a name reserved never to
 * resolve (RFC 6761). The gateway does not read it; the certificate is still checked against the IP.
 */
const ipServerName = 'gateway.invalid';

/** The host of a gateway address (`host:port`, `[v6]:port` or a bare host). */
function gatewayHost(address: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracketed) return bracketed[1]!;
  if (isIP(address)) return address;
  const colon = address.lastIndexOf(':');
  return colon === -1 ? address : address.slice(0, colon);
}

/**
 * Channel credentials and options for dialling the gateway over TLS, trusting only the control
 * plane's CA and, given a key and certificate, presenting the node's identity (mutual TLS).
 *
 * grpc-js sends the target host as the TLS server name (SNI), which Node refuses for an IP address
 * with a deprecation warning on every process (RFC 6066 allows names only). Dialled by name, the
 * name goes as is. Dialled by IP, a placeholder name goes instead and the certificate is checked
 * against the IP address, as it always was: the gateway's certificate carries its IPs in its SAN.
 */
export function gatewayChannel(
  address: string,
  tls: { caCertificatePem: string; privateKeyPem?: string; certificatePem?: string },
  /** Told when the gateway's certificate does not name the address dialled (the call then fails). */
  onIdentityRefused?: (error: Error) => void,
): { credentials: ChannelCredentials; options: ChannelOptions } {
  const host = gatewayHost(address);
  const byIp = isIP(host) !== 0;
  const check = (name: string, cert: PeerCertificate) => {
    const refused = checkServerIdentity(byIp ? host : name, cert);
    if (refused) onIdentityRefused?.(refused);
    return refused;
  };
  const channelCredentials = credentials.createSsl(
    Buffer.from(tls.caCertificatePem),
    tls.privateKeyPem ? Buffer.from(tls.privateKeyPem) : null,
    tls.certificatePem ? Buffer.from(tls.certificatePem) : null,
    byIp || onIdentityRefused ? { checkServerIdentity: check } : {},
  );
  return {
    credentials: channelCredentials,
    options: byIp ? { 'grpc.ssl_target_name_override': ipServerName } : {},
  };
}
