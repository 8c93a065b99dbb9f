import type { Command } from 'commander';
import type { Methods } from '../../api/registry.ts';
import type { MethodOutput } from '../../client/index.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';

type RolloutView = MethodOutput<Methods, 'rollouts', 'get'>;

/** The per-wave progress view: nodes done, in progress, failed; per pool the budget in use. */
export function renderRollout(r: RolloutView): string {
  const lines = [
    renderFields([
      ['id', r.id],
      ['release', `${r.version ?? '?'} (${r.releaseId})`],
      ['state', r.state + (r.rollback ? ` (${r.rollback})` : '')],
      ['wave', `${Math.min(r.currentWave + 1, r.waves.length)} of ${r.waves.length}`],
      ['paused because', r.pauseReason],
      ['created', formatTime(r.createdAt)],
      ['finished', formatTime(r.finishedAt)],
    ]),
    renderTable(r.waves, [
      {
        header: 'WAVE',
        value: (w) => `${w.index + 1}${w.index === r.currentWave && r.state !== 'completed' ? ' ◀' : ''}`,
      },
      { header: 'UP TO', value: (w) => `${w.percent}%`, right: true },
      { header: 'NODES', value: (w) => w.nodes, right: true },
      { header: 'DONE', value: (w) => w.done, right: true },
      { header: 'IN PROGRESS', value: (w) => w.inProgress, right: true },
      { header: 'FAILED', value: (w) => w.failed, right: true },
      { header: 'SKIPPED', value: (w) => w.skipped, right: true },
      { header: 'ROLLED BACK', value: (w) => w.rolledBack, right: true },
      { header: 'PENDING', value: (w) => w.pending, right: true },
    ]),
    'budget in use:',
    ...r.budgets.map(
      (b) => `  ${b.poolId}  ${b.inUse} of ${b.maxUpdating} updating (soak ${b.soakSeconds} s)`,
    ),
  ];
  const failures = r.waves.flatMap((w) => w.failures.map((f) => ({ ...f, wave: w.index + 1 })));
  if (failures.length) {
    lines.push('failures:');
    for (const f of failures) {
      lines.push(
        `  wave ${f.wave}  ${f.name} (${f.nodeId}): ${f.reason}${f.rolledBack ? ' [back on its previous version]' : ''}${f.acknowledged ? ' [resumed past]' : ''}`,
      );
    }
  }
  return lines.join('\n');
}

/** `rollouts create|get|list|watch|pause|resume|abort`. */
export function registerRolloutCommands(program: Command) {
  const rollouts = program.command('rollouts').description('Signed bcd releases rolled out in waves.');

  withConnection(
    rollouts
      .command('create')
      .description('Roll a release out in waves within each pool’s disruption budget.')
      .addOption(required('--release <id>', 'the release (releases list)'))
      .option('--pool <id...>', 'the pools whose nodes to update')
      .option('--label <key=value...>', 'only nodes with these labels')
      .option('--waves <percents>', 'cumulative percentages, e.g. 1,10,50,100 (the default)')
      .addOption(
        required('--idempotency-key <key>', 'a key of your own: the same key again answers the same rollout'),
      ),
  ).action(
    apiAction<{ release: string; pool?: string[]; label?: string[]; waves?: string; idempotencyKey: string }>(
      async ({ options, client, out }) => {
        const labels = Object.fromEntries(
          (options.label ?? []).map((l) => {
            const at = l.indexOf('=');
            return [l.slice(0, at), l.slice(at + 1)];
          }),
        );
        const rollout = await client.rollouts.create({
          releaseId: options.release,
          selector: {
            ...(options.pool?.length ? { poolIds: options.pool } : {}),
            ...(Object.keys(labels).length ? { labels } : {}),
          },
          ...(options.waves ? { waves: options.waves.split(',').map(Number) } : {}),
          idempotencyKey: options.idempotencyKey,
        });
        out.result(
          rollout,
          (r) => `${r.created ? 'created' : 'already exists'}: ${r.id}\n${renderRollout(r)}`,
        );
      },
    ),
  );

  withConnection(
    rollouts
      .command('get')
      .description('One rollout, with its per-wave progress.')
      .argument('<rollout-id>')
      .option('--nodes', 'list every node of it too'),
  ).action(
    apiAction<{ nodes?: boolean }>(async ({ options, client, out }, id) => {
      const rollout = await client.rollouts.get({ rolloutId: id!, nodes: options.nodes === true });
      out.result(rollout, (r) =>
        [
          renderRollout(r),
          ...(r.nodes ?? []).map(
            (n) =>
              `  wave ${n.wave + 1}  ${n.name}  ${n.state}  ${n.agentVersion ?? '?'}${n.reason ? `  ${n.reason}` : ''}`,
          ),
        ].join('\n'),
      );
    }),
  );

  withConnection(
    rollouts
      .command('list')
      .description('Rollouts, newest first.')
      .option('--state <state>', 'running, paused, completed or aborted')
      .option('--limit <n>', 'at most this many', parse.positiveInt),
  ).action(
    apiAction<{ state?: string; limit?: number }>(async ({ options, client, out }) => {
      const page = await client.rollouts.list({
        ...(options.state ? { state: options.state as never } : {}),
        ...(options.limit ? { limit: options.limit } : {}),
      });
      out.result(page, (p) =>
        p.rollouts.length === 0
          ? 'no rollouts'
          : renderTable(p.rollouts, [
              { header: 'ID', value: (r) => r.id },
              { header: 'VERSION', value: (r) => r.version },
              { header: 'STATE', value: (r) => r.state },
              {
                header: 'WAVE',
                value: (r) => `${Math.min(r.currentWave + 1, r.waves.length)}/${r.waves.length}`,
              },
              { header: 'DONE', value: (r) => r.waves.reduce((n, w) => n + w.done, 0), right: true },
              { header: 'FAILED', value: (r) => r.waves.reduce((n, w) => n + w.failed, 0), right: true },
              { header: 'CREATED', value: (r) => formatTime(r.createdAt) },
            ]),
      );
    }),
  );

  withConnection(
    rollouts
      .command('watch')
      .description(
        'Follow a rollout until it completes, is aborted or pauses (with --json: one JSON document per change).',
      )
      .argument('<rollout-id>')
      .option('--interval <duration>', 'how often to look (default 2s)', parse.duration)
      .option('--through-pause', 'keep watching while it is paused'),
  ).action(
    apiAction<{ interval?: number; throughPause?: boolean }>(async ({ options, client, out }, id) => {
      let last = '';
      for (;;) {
        const rollout = await client.rollouts.get({ rolloutId: id! });
        const shown = JSON.stringify({ ...rollout, updatedAt: 0 });
        if (shown !== last) {
          last = shown;
          if (out.json) process.stdout.write(`${JSON.stringify(rollout)}\n`);
          else process.stdout.write(`\n${renderRollout(rollout)}\n`);
        }
        const ended =
          rollout.state === 'completed' ||
          (rollout.state === 'aborted' && rollout.rollback !== 'rolling-back') ||
          (rollout.state === 'paused' && !options.throughPause);
        if (ended) return;
        await new Promise((r) => setTimeout(r, options.interval ?? 2_000));
      }
    }),
  );

  withConnection(
    rollouts
      .command('pause')
      .description('Pause: no new node starts; nodes in their health gate finish it.')
      .argument('<rollout-id>')
      .option('--reason <text>', 'why, shown by rollouts get'),
  ).action(
    apiAction<{ reason?: string }>(async ({ options, client, out }, id) => {
      const r = await client.rollouts.pause({
        rolloutId: id!,
        ...(options.reason ? { reason: options.reason } : {}),
      });
      out.result(r, renderRollout);
    }),
  );

  withConnection(
    rollouts.command('resume').description('Resume a paused rollout.').argument('<rollout-id>'),
  ).action(
    apiAction(async ({ client, out }, id) => {
      out.result(await client.rollouts.resume({ rolloutId: id! }), renderRollout);
    }),
  );

  withConnection(
    rollouts
      .command('abort')
      .description(
        'Abort: no new node starts; updated nodes stay (or, with --rollback, go back in reverse waves).',
      )
      .argument('<rollout-id>')
      .option('--rollback', 'roll updated nodes back to their previous version'),
  ).action(
    apiAction<{ rollback?: boolean }>(async ({ options, client, out }, id) => {
      out.result(
        await client.rollouts.abort({ rolloutId: id!, rollback: options.rollback === true }),
        renderRollout,
      );
    }),
  );
}
