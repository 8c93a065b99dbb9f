import { ServerCredentials, type ServerDuplexStream, type ServerUnaryCall } from '@grpc/grpc-js';
import { certificateIdentity } from '../domain/pki.ts';

/**
 * The gateway's TLS: its server certificate from the control plane's CA, and client certificates
 * requested on every connection and verified against the same CA. Sessions and renewals read the
 * verified peer certificate and refuse a connection without one; only Join answers a machine that
 * has no certificate yet.
 */
export function gatewayCredentials(input: {
  caCertificatePem: string;
  certificatePem: string;
  privateKeyPem: string;
}): ServerCredentials {
  return new RequestedClientCertificateCredentials(
    { requestCert: true, rejectUnauthorized: false },
    {
      ca: Buffer.from(input.caCertificatePem),
      cert: Buffer.from(input.certificatePem),
      key: Buffer.from(input.privateKeyPem),
    },
  );
}

/**
 * TLS that asks every client for a certificate and verifies any it gets against the CA, but lets
 * the handshake finish without one (for Join); the session handlers refuse unverified peers.
 */
class RequestedClientCertificateCredentials extends ServerCredentials {
  override _equals(other: ServerCredentials): boolean {
    return other === this;
  }
}

/** The CA-verified client certificate of a call, or null (none, or one the CA did not sign). */
export function verifiedPeer(
  call: ServerUnaryCall<unknown, unknown> | ServerDuplexStream<unknown, unknown>,
): { serial: string; spiffeId: string | null } | null {
  const auth = call.getAuthContext();
  const peer = auth.sslPeerCertificate;
  if (auth.transportSecurityType !== 'ssl' || !peer?.raw || !peer.serialNumber) return null;
  return certificateIdentity({ serialNumber: peer.serialNumber, subjectAltName: peer.subjectaltname });
}
