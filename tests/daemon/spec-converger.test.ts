import { existsSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { NodeIdentity } from '../../daemon/identity.ts';
import { Journal } from '../../daemon/journal.ts';
import { SpecConverger } from '../../daemon/spec-converger.ts';
import { generateKeyPairPem } from '../../domain/pki.ts';
import type { AgentMessage } from '../../proto/gen/agent/v1/agent.ts';
import { testLogger } from '../support/logger.ts';
import { useTempDir } from '../support/temp-dir.ts';

const dir = useTempDir('bcd-spec-');

const hold = (allocationId: string) => ({
  allocationId,
  deviceIds: ['dev_1'],
  stableIds: ['GPU-1'],
  until: 1_800_000_000_000,
  binding: 'hold',
});
const whole = (generation: number, spec: unknown) => ({
  generation,
  whole: true,
  specJson: Buffer.from(JSON.stringify(spec)),
  baseGeneration: 0,
  patchJson: Buffer.alloc(0),
});
const patch = (generation: number, base: number, sections: unknown) => ({
  generation,
  whole: false,
  specJson: Buffer.alloc(0),
  baseGeneration: base,
  patchJson: Buffer.from(JSON.stringify(sections)),
});

describe('the spec converger', () => {
  it('applies whole specs and patches, reports holds, and refuses anything older than it converged', async () => {
    const keys = await generateKeyPairPem();
    const identity = { nodeId: 'node_x', privateKeyPem: keys.privateKeyPem } as NodeIdentity;
    const sent: AgentMessage[] = [];
    const roots = { cdiDir: path.join(dir, 'cdi'), envDir: path.join(dir, 'env') };
    const journal = new Journal(path.join(dir, 'state'));
    const make = () =>
      new SpecConverger({
        roots,
        journal,
        identity,
        log: testLogger(),
        send: (m) => sent.push(m),
      });
    const converger = make();
    expect(converger.onSpec(whole(2, { devices: [hold('alloc_a')] }))).toEqual({
      observedGeneration: 2,
      error: '',
    });
    expect(existsSync(path.join(roots.cdiDir, 'bcd-alloc_a.json'))).toBe(true);
    expect(sent.filter((m) => m.body?.$case === 'report')).toHaveLength(1);
    expect(converger.onSpec(patch(4, 3, { devices: [] }))).toEqual({
      observedGeneration: 2,
      error: 'base-mismatch',
    });
    expect(converger.onSpec(patch(3, 2, { devices: [] }))).toEqual({ observedGeneration: 3, error: '' });
    expect(existsSync(path.join(roots.cdiDir, 'bcd-alloc_a.json'))).toBe(false);
    await journal.persist();
    // A restarted agent (same journal) refuses a spec older than the one it converged.
    const restarted = make();
    const stale = restarted.onSpec(whole(2, { devices: [hold('alloc_a')] }));
    expect(stale).toEqual({ observedGeneration: 3, error: 'stale generation 2' });
    expect(existsSync(path.join(roots.cdiDir, 'bcd-alloc_a.json'))).toBe(false);
    const bad = restarted.onSpec(whole(5, { devices: [{ allocationId: 'x' }] }));
    expect(bad.error).toMatch(/^converge failed/);
  });
});
