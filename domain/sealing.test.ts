import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createSealer, isSealed, SealedValueError, sealingPurposes } from './sealing.ts';

const secret = 'correct horse battery staple, twice over';
const sealer = createSealer(secret);

function openError(run: () => unknown): SealedValueError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(SealedValueError);
    return error as SealedValueError;
  }
  throw new Error('the value opened');
}

describe('sealing', () => {
  it('round-trips any text for every purpose, in the versioned, self-describing form', () => {
    fc.assert(
      fc.property(fc.constantFrom(...sealingPurposes), fc.string({ unit: 'grapheme' }), (purpose, text) => {
        const sealed = sealer.seal(purpose, text);
        expect(sealed).toMatch(new RegExp(`^sealed:v1:${purpose}:[A-Za-z0-9+/]+=*$`));
        expect(isSealed(sealed)).toBe(true);
        expect(sealer.open(purpose, sealed)).toBe(text);
      }),
    );
  });

  it('never shows the plaintext, and seals equal inputs differently (a fresh nonce)', () => {
    const plaintext = '-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMG\n-----END PRIVATE KEY-----\n';
    const a = sealer.seal('ca-key', plaintext);
    const b = sealer.seal('ca-key', plaintext);
    expect(a).not.toBe(b);
    expect(a).not.toContain('PRIVATE KEY');
    expect(a).not.toContain(Buffer.from(plaintext).toString('base64').slice(0, 16));
  });

  it('opens with another sealer of the same secret (another process of the deployment)', () => {
    const sealed = sealer.seal('webhook-secret', 'whsec_abc');
    expect(createSealer(secret).open('webhook-secret', sealed)).toBe('whsec_abc');
  });

  it('refuses another deployment secret with an error naming BETTER_COMPUTE_SECRET', () => {
    const sealed = sealer.seal('ca-key', 'the key');
    const error = openError(() => createSealer('x'.repeat(32)).open('ca-key', sealed));
    expect(error.message).toContain('BETTER_COMPUTE_SECRET');
    expect(error.message).toContain('changed');
    expect(error.message).not.toContain('the key');
  });

  it('binds the purpose: a sealed webhook secret is not a CA key, even with its header rewritten', () => {
    const sealed = sealer.seal('webhook-secret', 'whsec_abc');
    expect(openError(() => sealer.open('ca-key', sealed)).message).toBe(
      'the stored ca-key holds a sealed webhook-secret, not a ca-key',
    );
    const relabelled = sealed.replace('sealed:v1:webhook-secret:', 'sealed:v1:ca-key:');
    expect(openError(() => sealer.open('ca-key', relabelled)).message).toContain('cannot be opened');
  });

  it('refuses altered, truncated, foreign-version and plaintext values', () => {
    const sealed = sealer.seal('bmc-credential', 'admin:hunter2');
    const payload = Buffer.from(sealed.split(':')[3]!, 'base64');
    payload[20] = payload[20]! ^ 1;
    const altered = `sealed:v1:bmc-credential:${payload.toString('base64')}`;
    expect(openError(() => sealer.open('bmc-credential', altered)).message).toContain('altered');
    expect(openError(() => sealer.open('bmc-credential', 'sealed:v1:bmc-credential:AAAA')).message).toContain(
      'truncated',
    );
    expect(openError(() => sealer.open('bmc-credential', sealed.replace(':v1:', ':v9:'))).message).toContain(
      'format v9',
    );
    expect(openError(() => sealer.open('bmc-credential', 'admin:hunter2')).message).toBe(
      'the stored bmc-credential is not a sealed value',
    );
    expect(isSealed('-----BEGIN PRIVATE KEY-----')).toBe(false);
    expect(isSealed('whsec_abc')).toBe(false);
  });

  it('refuses a short deployment secret and an unknown purpose', () => {
    expect(() => createSealer('too short')).toThrow(
      /at least 32 characters: generate one with `openssl rand/,
    );
    expect(() => sealer.seal('ssh-key' as never, 'x')).toThrow(SealedValueError);
  });
});
