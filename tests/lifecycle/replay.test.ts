import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { bundleWorkflowCode, Worker } from '@temporalio/worker';
import { DeterminismViolationError } from '@temporalio/workflow';
import { describe, expect, it } from 'vitest';
import { workflowBundle } from '../../temporal/worker.ts';
import { historyFromRecordedJson } from '../histories/format.ts';

const dir = new URL('../histories/', import.meta.url);
const histories = readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .map((f) => ({
    name: f.replace(/\.json$/, ''),
    history: historyFromRecordedJson(readFileSync(new URL(f, dir), 'utf8')),
  }));

describe('replaying recorded lifecycle histories', () => {
  it('has recorded histories to replay', () => {
    expect(histories.map((h) => h.name)).toEqual(
      expect.arrayContaining([
        'full-path',
        'lease-lapsed',
        'bind-retry',
        'confirmation-expired',
        'renewed-then-cancelled',
        'full-path-observed-locally',
        'full-path-lean',
      ]),
    );
  });

  it.each(histories)('replays $name without a determinism error', async ({ name, history }) => {
    await Worker.runReplayHistory({ workflowBundle: await workflowBundle() }, history, name);
  });

  it('fails with a determinism error against a workflow changed without patched()', async () => {
    const changed = await bundleWorkflowCode({
      workflowsPath: fileURLToPath(new URL('../histories/changed-workflow.ts', import.meta.url)),
      logger: { log() {}, trace() {}, debug() {}, info() {}, warn() {}, error() {} },
    });
    const fullPath = histories.find((h) => h.name === 'full-path')!;
    await expect(
      Worker.runReplayHistory({ workflowBundle: changed }, fullPath.history, 'full-path'),
    ).rejects.toBeInstanceOf(DeterminismViolationError);
  });
});
