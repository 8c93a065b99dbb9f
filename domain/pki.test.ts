import 'reflect-metadata';
import { webcrypto, X509Certificate } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import { describe, expect, it } from 'vitest';
import {
  certificateIdentity,
  createCertificateAuthority,
  createCsr,
  generateKeyPairPem,
  issueNodeCertificate,
  keyIdOfPublicKey,
  readCsr,
} from './pki.ts';

describe('node certificates', () => {
  it('are valid X.509 for OpenSSL, signed by the CA, with the profile and the serial recorded, for every random serial', async () => {
    const ca = await createCertificateAuthority('pki.test');
    const caCert = new X509Certificate(ca.certificatePem);
    const keys = await generateKeyPairPem();
    const csr = await readCsr(await createCsr(keys, 'node-1'));
    const now = new Date('2030-01-01T00:00:00Z');
    // Random serials: about 1 in 256 starts with a zero byte, 1 in 2 has its high bit set after it.
    for (let i = 0; i < 1500; i++) {
      const issued = await issueNodeCertificate({
        ca,
        publicKeyPem: csr.publicKeyPem,
        spiffeId: 'spiffe://pki.test/site/s1/node/n1',
        nodeName: 'node,1',
        role: 'node',
        now,
        validForMs: 48 * 3600_000,
      });
      const cert = new X509Certificate(issued.certificatePem);
      // The identity as the gateway reads a peer (from the fields Node's parser gives).
      const identity = certificateIdentity(cert);
      expect(identity.serial).toBe(issued.serial);
      if (i > 0) continue;
      expect(identity.spiffeId).toBe('spiffe://pki.test/site/s1/node/n1');
      expect(cert.checkIssued(caCert)).toBe(true);
      expect(cert.verify(caCert.publicKey)).toBe(true);
      expect(cert.subject).toBe('CN=node_1\nOU=node');
      expect(cert.subjectAltName).toBe('URI:spiffe://pki.test/site/s1/node/n1');
      expect(cert.keyUsage).toEqual(['1.3.6.1.5.5.7.3.2']);
      expect(cert.ca).toBe(false);
      expect(cert.publicKey.export({ format: 'pem', type: 'spki' })).toBe(keys.publicKeyPem);
      expect(new Date(cert.validFrom).getTime()).toBe(now.getTime() - 60_000);
      // At most 24 hours, whatever is asked.
      expect(new Date(cert.validTo).getTime()).toBe(now.getTime() + 24 * 3600_000);
      expect(issued.notAfter.getTime()).toBe(now.getTime() + 24 * 3600_000);
    }
  });

  it('carry a UTF-8 name as given, and dates from 2050 as GeneralizedTime in whole seconds', async () => {
    const ca = await createCertificateAuthority('pki.test');
    const csr = await readCsr(await createCsr(await generateKeyPairPem(), 'node-1'));
    const now = new Date('2049-12-31T23:30:00.250Z');
    const issued = await issueNodeCertificate({
      ca,
      publicKeyPem: csr.publicKeyPem,
      spiffeId: 'spiffe://pki.test/site/s1/node/n2',
      nodeName: 'rack_7 nœud',
      role: 'node',
      now,
      validForMs: 3600_000,
    });
    const cert = new X509Certificate(issued.certificatePem);
    expect(cert.verify(new X509Certificate(ca.certificatePem).publicKey)).toBe(true);
    expect(cert.subject).toBe('CN=rack_7 nœud\nOU=node');
    // notBefore is in 2049 (UTCTime), notAfter in 2050 (GeneralizedTime); OpenSSL reads both.
    expect(new Date(cert.validFrom).getTime()).toBe(Date.parse('2049-12-31T23:29:00Z'));
    expect(new Date(cert.validTo).getTime()).toBe(Date.parse('2050-01-01T00:30:00Z'));
  });
});

describe('readCsr', () => {
  it('answers the key of a good request and its key id', async () => {
    const keys = await generateKeyPairPem();
    const csr = await readCsr(await createCsr(keys, 'node-1'));
    expect(csr.publicKeyPem).toBe(keys.publicKeyPem);
    expect(csr.keyId).toBe(keyIdOfPublicKey(keys.publicKeyPem));
  });

  it('refuses a request whose signature does not verify, one with another curve, and garbage: INVALID_INPUT', async () => {
    const keys = await generateKeyPairPem();
    const good = await createCsr(keys, 'node-1');
    const der = Buffer.from(good.replace(/-----[A-Z ]+-----|\s/g, ''), 'base64');
    // The last byte is the signature's: flipping it breaks the signature, not the encoding.
    der[der.length - 1] = der[der.length - 1]! ^ 0x01;
    const tampered = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
    await expect(readCsr(tampered)).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: /does not verify/,
    });
    const csr384 = await x509.Pkcs10CertificateRequestGenerator.create({
      name: 'CN=node-1',
      keys: await webcrypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-384' }, true, [
        'sign',
        'verify',
      ]),
      signingAlgorithm: { name: 'ECDSA', hash: 'SHA-384' },
    });
    await expect(readCsr(csr384.toString('pem'))).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: /ECDSA P-256/,
    });
    // A request with bytes after it, and one whose signed part was changed.
    const trailing = Buffer.concat([
      Buffer.from(good.replace(/-----[A-Z ]+-----|\s/g, ''), 'base64'),
      Buffer.from([0]),
    ]);
    await expect(
      readCsr(
        `-----BEGIN CERTIFICATE REQUEST-----\n${trailing.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`,
      ),
    ).rejects.toMatchObject({ code: 'INVALID_INPUT', message: /not a PEM/ });
    const renamed = Buffer.from(good.replace(/-----[A-Z ]+-----|\s/g, ''), 'base64');
    const at = renamed.indexOf(Buffer.from('node-1'));
    renamed[at] = 'm'.charCodeAt(0);
    await expect(
      readCsr(
        `-----BEGIN CERTIFICATE REQUEST-----\n${renamed.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`,
      ),
    ).rejects.toMatchObject({ code: 'INVALID_INPUT', message: /does not verify/ });
    await expect(readCsr('not a request')).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: /not a PEM/,
    });
  });
});
