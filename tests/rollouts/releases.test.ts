import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SelfUpdater } from '../../daemon/self-update.ts';
import { signRelease } from '../../domain/release-manifest.ts';
import { type ApiFixture, createApiFixture } from '../support/api.ts';
import { useFixture } from '../support/hooks.ts';
import { testLogger } from '../support/logger.ts';
import { manifestOf, newSigner, publishBody, simulatedBinary } from './support.ts';

const pinned = newSigner();
const second = newSigner();
const stranger = newSigner();

const api = useFixture<ApiFixture>(
  () =>
    createApiFixture({
      env: {
        BETTER_COMPUTE_RELEASE_PINS: `${pinned.pin},${second.pin}`,
        BETTER_COMPUTE_RELEASE_THRESHOLD: '1',
      },
    }),
  (f) => f.stop(),
);

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A simulated node's bcd at `version`, pinning `pinned` (its own trust, not the control plane's). */
function bcdAt(version: string, threshold = 1) {
  const dir = mkdtempSync(path.join(tmpdir(), 'bc-bcd-'));
  dirs.push(dir);
  return new SelfUpdater({
    stateDir: dir,
    baseVersion: version,
    baseProtocolVersion: 3,
    trust: { pins: [pinned.pin, second.pin], threshold },
    log: testLogger('bcd-self-update'),
  });
}

/** The bcd.update payload a tampered or honest release makes. */
function updatePayload(body: ReturnType<typeof publishBody>) {
  return {
    releaseId: 'rel_test',
    manifest: body.manifest,
    signatures: body.signatures,
    files: body.files,
    soakMs: 100,
  };
}

describe('a release is refused by the control plane and by bcd', () => {
  const files = simulatedBinary('1.0.0');

  const cases = [
    {
      name: 'a bad signature (signed over another manifest)',
      refusal: 'bad-signature',
      body: () => {
        const body = publishBody(manifestOf('1.0.0', files), [pinned], files);
        const other = manifestOf('1.0.1', files);
        body.signatures = [
          { ...body.signatures[0]!, signature: signRelease(other, pinned.privateKeyPem).signature },
        ];
        return body;
      },
    },
    {
      name: 'a digest mismatch in one file',
      refusal: 'digest-mismatch',
      body: () => {
        const body = publishBody(manifestOf('1.0.0', files), [pinned], files);
        body.files[0] = {
          path: body.files[0]!.path,
          content: Buffer.from('#!/bin/sh\n# tampered\n').toString('base64'),
        };
        return body;
      },
    },
    {
      name: 'an expired release',
      refusal: 'expired',
      body: () =>
        publishBody(
          manifestOf('1.0.0', files, { expiresAt: new Date(Date.now() - 60_000).toISOString() }),
          [pinned],
          files,
        ),
    },
    {
      name: 'a signature from an unpinned key',
      refusal: 'unpinned-key',
      body: () => publishBody(manifestOf('1.0.0', files), [stranger], files),
    },
  ] as const;

  for (const c of cases) {
    it(`${c.name}: control plane ${c.refusal}, nothing stored`, async () => {
      const answer = await api.call(api.root.token, 'releases/publish', c.body());
      expect(answer.status).toBe(400);
      expect(answer.body.error.details.refusal).toBe(c.refusal);
      const list = await api.call(api.root.token, 'releases/list', {});
      expect(list.body.data.releases).toHaveLength(0);
    });

    it(`${c.name}: bcd refuses it too and stays on its slot`, () => {
      const bcd = bcdAt('0.9.0');
      expect(() => bcd.stage(updatePayload(c.body()))).toThrow(
        new RegExp(`release refused by bcd \\(${c.refusal}:`),
      );
      expect(bcd.current().version).toBe('0.9.0');
    });
  }

  it('a downgrade: the control plane refuses a version not above the channel’s newest; bcd one not above what it runs', async () => {
    const v2 = simulatedBinary('2.0.0');
    const m2 = manifestOf('2.0.0', v2);
    const ok = await api.call(api.root.token, 'releases/publish', publishBody(m2, [pinned], v2));
    expect(ok.status).toBe(200);
    expect(ok.body.data).toMatchObject({ version: '2.0.0', created: true, signerPins: [pinned.pin] });
    // The same manifest again is the same release.
    const again = await api.call(api.root.token, 'releases/publish', publishBody(m2, [pinned], v2));
    expect(again.status).toBe(200);
    expect(again.body.data).toMatchObject({ id: ok.body.data.id, created: false });
    const down = await api.call(
      api.root.token,
      'releases/publish',
      publishBody(manifestOf('1.9.9', files), [pinned], files),
    );
    expect(down.status).toBe(409);
    expect(down.body.error.details.refusal).toBe('downgrade');
    expect(down.body.error.message).toMatch(/not newer than 2\.0\.0/);

    const bcd = bcdAt('2.0.0');
    expect(() => bcd.stage(updatePayload(publishBody(manifestOf('1.9.9', files), [pinned], files)))).toThrow(
      /release refused by bcd \(downgrade:/,
    );
  });

  it('k of n: a threshold of 2 needs two distinct pinned signers, on both sides', async () => {
    const v3 = simulatedBinary('3.0.0');
    const one = publishBody(manifestOf('3.0.0', v3), [pinned, pinned], v3);
    const bcd = bcdAt('2.0.0', 2);
    expect(() => bcd.stage(updatePayload(one))).toThrow(/below-threshold/);
    const two = publishBody(manifestOf('3.0.0', v3), [pinned, second], v3);
    expect(bcd.stage(updatePayload(two))).toMatchObject({ staged: '3.0.0', from: '2.0.0' });
    expect(bcd.current().version).toBe('3.0.0');
  });

  it('a release needing a newer control plane or an unsupported protocol is refused', async () => {
    const v4 = simulatedBinary('4.0.0');
    const newer = await api.call(
      api.root.token,
      'releases/publish',
      publishBody(manifestOf('4.0.0', v4, { minControlPlaneVersion: '9.0.0' }), [pinned], v4),
    );
    expect(newer.body.error.details.refusal).toBe('control-plane-too-old');
    const protocol = await api.call(
      api.root.token,
      'releases/publish',
      publishBody(manifestOf('4.0.0', v4, { protocolVersion: 9 }), [pinned], v4),
    );
    expect(protocol.body.error.details.refusal).toBe('protocol-unsupported');
  });

  it('only root administrators publish', async () => {
    const { tenantMember } = await import('../support/iam.ts');
    const member = await tenantMember(api.iam, 'acme');
    const v5 = simulatedBinary('5.0.0');
    const answer = await api.call(
      member.token,
      'releases/publish',
      publishBody(manifestOf('5.0.0', v5), [pinned], v5),
    );
    expect(answer.status).toBe(403);
  });
});
