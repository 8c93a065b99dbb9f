import 'reflect-metadata';
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  type KeyObject,
  X509Certificate as NodeX509Certificate,
  randomBytes,
  sign as signDigest,
  verify as verifySignature,
  webcrypto,
} from 'node:crypto';
import { AsnConvert } from '@peculiar/asn1-schema';
import * as asn1X509 from '@peculiar/asn1-x509';
import * as x509 from '@peculiar/x509';
import * as asn1js from 'asn1js';
import { ComputeError } from './errors.ts';

/**
 * The control plane's machine PKI: its own ECDSA P-256 CA, node certificates named by SPIFFE ID
 * (at most 24 hours), the gateway's server certificate and node CSRs. X.509 and PKCS#10 come from
 * @peculiar/x509 over Node's webcrypto. What runs on every Join (reading the CSR, building the node
 * certificate) uses asn1js, the BER/DER codec beneath it, directly: the schema classes above it
 * cost about 2 ms of CPU a Join in parsing, validating and re-serializing. Signatures are Node's
 * native ECDSA. Nothing here hand-rolls ASN.1.
 */

type CryptoKey = webcrypto.CryptoKey;
const crypto = webcrypto;
x509.cryptoProvider.set(crypto as never);

const ecdsa = { name: 'ECDSA', namedCurve: 'P-256' } as const;
const signing = { name: 'ECDSA', hash: 'SHA-256' } as const;

/** The longest a node certificate may live. */
export const maxNodeCertificateMs = 24 * 60 * 60 * 1000;

export interface CaMaterial {
  certificatePem: string;
  privateKeyPem: string;
}

export interface KeyPairPem {
  privateKeyPem: string;
  publicKeyPem: string;
}

function toPem(der: ArrayBuffer, label: string): string {
  const b64 = Buffer.from(der).toString('base64');
  const lines = b64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join('\n')}\n-----END ${label}-----\n`;
}

/** Imported signing keys by PEM (the CA's key is imported once per process, not per join). */
const importedKeys = new Map<string, Promise<CryptoKey>>();

function importPrivateKey(pem: string): Promise<CryptoKey> {
  let key = importedKeys.get(pem);
  if (!key) {
    const der = createPrivateKey(pem).export({ format: 'der', type: 'pkcs8' });
    key = crypto.subtle.importKey('pkcs8', der, ecdsa, true, ['sign']);
    if (importedKeys.size > 1_000) importedKeys.clear();
    importedKeys.set(pem, key);
  }
  return key;
}

async function importPublicKey(pem: string): Promise<CryptoKey> {
  return crypto.subtle.importKey('spki', spkiDer(pem), ecdsa, true, ['verify']);
}

/** The SPKI DER of a public key PEM (a `PUBLIC KEY` PEM is that DER in base64, read as is). */
function spkiDer(pem: string): Buffer {
  const body = /^-----BEGIN PUBLIC KEY-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END PUBLIC KEY-----\s*$/.exec(
    pem,
  )?.[1];
  return body ? Buffer.from(body, 'base64') : createPublicKey(pem).export({ format: 'der', type: 'spki' });
}

/**
 * What signing node certificates with a CA needs, prepared once per CA (not once per Join): its
 * private key as a native KeyObject and its subject, decoded, as the issuer name.
 */
interface NodeCertificateSigner {
  key: KeyObject;
  issuer: asn1js.AsnType;
}
const nodeSigners = new Map<string, NodeCertificateSigner>();

function nodeSigner(ca: CaMaterial): NodeCertificateSigner {
  const cacheKey = `${ca.certificatePem}\n${ca.privateKeyPem}`;
  let signer = nodeSigners.get(cacheKey);
  if (!signer) {
    const caCert = AsnConvert.parse(new NodeX509Certificate(ca.certificatePem).raw, asn1X509.Certificate);
    signer = {
      key: createPrivateKey(ca.privateKeyPem),
      issuer: decodeDer(AsnConvert.serialize(caCert.tbsCertificate.subject)),
    };
    if (nodeSigners.size > 100) nodeSigners.clear();
    nodeSigners.set(cacheKey, signer);
  }
  return signer;
}

/** One whole value decoded by asn1js (a BER reader, so DER too); throws unless it is exactly one well-formed value. */
function decodeDer(der: ArrayBuffer | Uint8Array): asn1js.AsnType {
  const bytes = der instanceof Uint8Array ? der : new Uint8Array(der);
  const decoded = asn1js.fromBER(bytes);
  if (decoded.offset !== bytes.byteLength || decoded.result.error) throw new Error('not one DER value');
  return decoded.result;
}

/** The elements of a decoded SEQUENCE, or an error when it is not one. */
function sequenceItems(value: asn1js.AsnType | undefined): asn1js.AsnType[] {
  if (!(value instanceof asn1js.Sequence)) throw new Error('not a SEQUENCE');
  return value.valueBlock.value;
}

/** The bytes a decoded value was read from (what a signature covers), as a Buffer. */
function bytesRead(value: asn1js.AsnType): Buffer {
  const view = (value as asn1js.BaseBlock).valueBeforeDecodeView;
  return Buffer.from(view.buffer, view.byteOffset, view.byteLength);
}

/**
 * A serial (positive hex) as DER INTEGER contents: minimal (a random serial starting with 0x00
 * would be refused by OpenSSL as illegal padding) and positive (a leading 0x00 where the first
 * byte left has its high bit set).
 */
function serialOctets(serial: string): ArrayBuffer {
  const bytes = Buffer.from(serial, 'hex');
  let first = 0;
  while (first < bytes.length - 1 && bytes[first] === 0) first++;
  const minimal = bytes.subarray(first);
  return new Uint8Array(minimal[0]! > 0x7f ? Buffer.concat([Buffer.from([0]), minimal]) : minimal).buffer;
}

/** ecdsa-with-SHA256 (RFC 5758): the CA's signature on every certificate. */
const ecdsaWithSha256 = '1.2.840.10045.4.3.2';

/** The extensions every node certificate carries but its name (built once: they never change). */
let nodeCertificateExtensions: asn1js.AsnType[] | undefined;
function nodeExtensions(): asn1js.AsnType[] {
  nodeCertificateExtensions ??= [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
    new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth]),
  ].map((e) => decodeDer(e.rawData));
  return nodeCertificateExtensions;
}

/** subjectAltName (2.5.29.17, not critical) naming one URI: GeneralNames { [6] IA5String }. */
function uriNameExtension(uri: string): asn1js.Sequence {
  const generalNames = new asn1js.Sequence({
    value: [
      new asn1js.Primitive({
        idBlock: { tagClass: 3, tagNumber: 6 },
        valueHex: new Uint8Array(Buffer.from(uri, 'ascii')),
      }),
    ],
  });
  return new asn1js.Sequence({
    value: [
      new asn1js.ObjectIdentifier({ value: '2.5.29.17' }),
      new asn1js.OctetString({ valueHex: generalNames.toBER() }),
    ],
  });
}

/** A certificate's Time (RFC 5280 4.1.2.5): UTCTime through 2049, GeneralizedTime from 2050, whole seconds. */
function certificateTime(at: Date): asn1js.UTCTime | asn1js.GeneralizedTime {
  const valueDate = new Date(Math.floor(at.getTime() / 1000) * 1000);
  return valueDate.getUTCFullYear() < 2050
    ? new asn1js.UTCTime({ valueDate })
    : new asn1js.GeneralizedTime({ valueDate });
}

/** A fresh ECDSA P-256 key pair as PEM (PKCS#8 and SPKI). */
export async function generateKeyPairPem(): Promise<KeyPairPem> {
  const keys = await crypto.subtle.generateKey(ecdsa, true, ['sign', 'verify']);
  return {
    privateKeyPem: toPem(await crypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY'),
    publicKeyPem: toPem(await crypto.subtle.exportKey('spki', keys.publicKey), 'PUBLIC KEY'),
  };
}

/** The key id of a public key: hex SHA-256 of its DER SubjectPublicKeyInfo. */
export function keyIdOfPublicKey(publicKeyPem: string): string {
  const der = createPublicKey(publicKeyPem).export({ format: 'der', type: 'spki' });
  return createHash('sha256').update(der).digest('hex');
}

/** `spiffe://<trust domain>/site/<site>/node/<node>`; names come only from JoinService. */
export function nodeSpiffeId(trustDomain: string, siteId: string, nodeId: string): string {
  return `spiffe://${trustDomain}/site/${siteId}/node/${nodeId}`;
}

function randomSerial(): string {
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f; // positive
  return bytes.toString('hex');
}

/** A new self-signed CA for the trust domain, valid ten years. */
export async function createCertificateAuthority(trustDomain: string): Promise<CaMaterial> {
  const keys = await crypto.subtle.generateKey(ecdsa, true, ['sign', 'verify']);
  const notBefore = new Date(Date.now() - 60_000);
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomSerial(),
    name: `CN=better-compute machine CA, O=${trustDomain}`,
    notBefore,
    notAfter: new Date(notBefore.getTime() + 10 * 365 * 24 * 3600 * 1000),
    keys,
    signingAlgorithm: signing,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return {
    certificatePem: cert.toString('pem'),
    privateKeyPem: toPem(await crypto.subtle.exportKey('pkcs8', keys.privateKey), 'PRIVATE KEY'),
  };
}

export interface CsrContents {
  publicKeyPem: string;
  keyId: string;
}

/**
 * Reads and checks a PKCS#10 request: its signature must verify and its key must be ECDSA P-256.
 * Whatever names it asks for are ignored (names come only from JoinService). INVALID_INPUT otherwise.
 */
export async function readCsr(csrPem: string): Promise<CsrContents> {
  // CertificationRequest ::= SEQUENCE { certificationRequestInfo, signatureAlgorithm, signature },
  // the info being SEQUENCE { version, subject, subjectPKInfo, attributes }. The signature is
  // checked over the info's bytes as sent, with Node's native ECDSA.
  let info: Buffer;
  let algorithm: string;
  let signature: Buffer;
  let key: KeyObject;
  try {
    const body =
      /-----BEGIN CERTIFICATE REQUEST-----([A-Za-z0-9+/=\s]+)-----END CERTIFICATE REQUEST-----/.exec(
        csrPem,
      )?.[1];
    if (!body) throw new Error('not PEM');
    const [infoValue, algorithmValue, signatureValue] = sequenceItems(decodeDer(Buffer.from(body, 'base64')));
    const publicKeyInfo = sequenceItems(infoValue)[2];
    const algorithmId = sequenceItems(algorithmValue)[0];
    if (!publicKeyInfo || !(algorithmId instanceof asn1js.ObjectIdentifier)) throw new Error('not PKCS#10');
    if (!(signatureValue instanceof asn1js.BitString) || signatureValue.valueBlock.unusedBits !== 0) {
      throw new Error('not a signature');
    }
    info = bytesRead(infoValue!);
    algorithm = algorithmId.getValue();
    signature = Buffer.from(signatureValue.valueBlock.valueHexView);
    key = createPublicKey({ key: bytesRead(publicKeyInfo), format: 'der', type: 'spki' });
  } catch {
    throw new ComputeError('INVALID_INPUT', 'the certificate request is not a PEM PKCS#10 request');
  }
  if (key.asymmetricKeyType !== 'ec' || key.asymmetricKeyDetails?.namedCurve !== 'prime256v1') {
    throw new ComputeError('INVALID_INPUT', 'the certificate request must carry an ECDSA P-256 key');
  }
  const verifies =
    algorithm === ecdsaWithSha256 && verifySignature('sha256', info, { key, dsaEncoding: 'der' }, signature);
  if (!verifies) {
    throw new ComputeError('INVALID_INPUT', 'the certificate request signature does not verify');
  }
  const der = key.export({ format: 'der', type: 'spki' });
  return {
    publicKeyPem: toPem(new Uint8Array(der).buffer, 'PUBLIC KEY'),
    keyId: createHash('sha256').update(der).digest('hex'),
  };
}

/** A PKCS#10 request for the key pair (the daemon's side of joining and renewal). */
export async function createCsr(keys: KeyPairPem, commonName: string): Promise<string> {
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: `CN=${commonName.replace(/[,=+<>#;"\\]/g, '_')}`,
    keys: {
      privateKey: await importPrivateKey(keys.privateKeyPem),
      publicKey: await importPublicKey(keys.publicKeyPem),
    },
    signingAlgorithm: signing,
  });
  return csr.toString('pem');
}

export interface IssuedCertificate {
  serial: string;
  certificatePem: string;
  notBefore: Date;
  notAfter: Date;
}

/**
 * Signs a node's client certificate: SPIFFE ID as the only URI name, role in the subject's OU,
 * client-auth only, valid from `now` for at most 24 hours. The key is embedded as the CSR gave it
 * (readCsr checked it is an ECDSA P-256 key whose CSR signature verifies).
 */
export async function issueNodeCertificate(input: {
  ca: CaMaterial;
  publicKeyPem: string;
  spiffeId: string;
  nodeName: string;
  role: string;
  now: Date;
  validForMs: number;
}): Promise<IssuedCertificate> {
  const validFor = Math.min(input.validForMs, maxNodeCertificateMs);
  const signer = nodeSigner(input.ca);
  const serial = randomSerial();
  const notBefore = new Date(input.now.getTime() - 60_000);
  const notAfter = new Date(input.now.getTime() + validFor);
  const algorithm = () =>
    new asn1js.Sequence({ value: [new asn1js.ObjectIdentifier({ value: ecdsaWithSha256 })] });
  const subject = new x509.Name(`CN=${input.nodeName.replace(/[,=+<>#;"\\]/g, '_')}, OU=${input.role}`);
  const tbsCertificate = new asn1js.Sequence({
    value: [
      new asn1js.Constructed({
        idBlock: { tagClass: 3, tagNumber: 0 },
        value: [new asn1js.Integer({ value: 2 })],
      }),
      new asn1js.Integer({ valueHex: serialOctets(serial) }),
      algorithm(),
      signer.issuer,
      new asn1js.Sequence({ value: [certificateTime(notBefore), certificateTime(notAfter)] }),
      decodeDer(subject.toArrayBuffer()),
      decodeDer(spkiDer(input.publicKeyPem)),
      new asn1js.Constructed({
        idBlock: { tagClass: 3, tagNumber: 3 },
        value: [new asn1js.Sequence({ value: [...nodeExtensions(), uriNameExtension(input.spiffeId)] })],
      }),
    ],
  });
  const tbs = Buffer.from(tbsCertificate.toBER());
  const signature = signDigest('sha256', tbs, { key: signer.key, dsaEncoding: 'der' });
  const certificate = new asn1js.Sequence({
    value: [tbsCertificate, algorithm(), new asn1js.BitString({ valueHex: new Uint8Array(signature) })],
  });
  return {
    serial: normalizeSerial(serial),
    certificatePem: toPem(certificate.toBER(), 'CERTIFICATE'),
    notBefore,
    notAfter,
  };
}

/** The gateway's TLS server certificate and key, signed by the CA (kept in memory only). */
export async function issueServerCertificate(input: {
  ca: CaMaterial;
  trustDomain: string;
  hosts: string[];
  validForMs?: number;
}): Promise<{ certificatePem: string; privateKeyPem: string }> {
  const keys = await generateKeyPairPem();
  const caCert = new x509.X509Certificate(input.ca.certificatePem);
  const names: x509.JsonGeneralName[] = [{ type: 'url', value: `spiffe://${input.trustDomain}/gateway` }];
  for (const host of new Set(input.hosts)) {
    names.push(/^[\d.]+$|:/.test(host) ? { type: 'ip', value: host } : { type: 'dns', value: host });
  }
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: randomSerial(),
    subject: 'CN=better-compute gateway',
    issuer: caCert.subject,
    notBefore: new Date(now - 60_000),
    notAfter: new Date(now + (input.validForMs ?? 30 * 24 * 3600 * 1000)),
    publicKey: await importPublicKey(keys.publicKeyPem),
    signingKey: await importPrivateKey(input.ca.privateKeyPem),
    signingAlgorithm: signing,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(names),
    ],
  });
  return { certificatePem: cert.toString('pem'), privateKeyPem: keys.privateKeyPem };
}

/** Serial numbers as stored: lower-case hex without leading zeros. */
export function normalizeSerial(serial: string): string {
  return serial.toLowerCase().replace(/^0+(?=.)/, '');
}

/**
 * The SPIFFE URI and serial of a certificate, from the fields Node's X.509 parser gives it
 * (`serialNumber`, and `subjectAltName` as `URI:…, DNS:…`): the gateway reads them from the peer
 * certificate its TLS socket already parsed, on every session it opens.
 */
export function certificateIdentity(fields: { serialNumber: string; subjectAltName?: string | undefined }): {
  serial: string;
  spiffeId: string | null;
} {
  const uri = /(?:^|,\s*)URI:(spiffe:\/\/[^,\s]+)/.exec(fields.subjectAltName ?? '')?.[1] ?? null;
  return { serial: normalizeSerial(fields.serialNumber), spiffeId: uri };
}

/** The expiry of a PEM certificate. */
export function certificateNotAfter(certificatePem: string): Date {
  return new Date(new NodeX509Certificate(certificatePem).validTo);
}
