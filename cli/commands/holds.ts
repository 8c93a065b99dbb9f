import type { Command } from 'commander';
import { withHold } from '../../client/holds.ts';
import { formatDuration } from '../../domain/duration.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';
import { resolvePool, tenantOf } from '../tenant.ts';

const notReported = 'not reported';
const shown = (v: number | null | undefined) => (v === null || v === undefined ? notReported : String(v));
const freeOf = (free: number | null, total: number | null) =>
  free === null ? notReported : `${free}/${total ?? notReported}`;

/**
 * `capacity list`, `capacity holds [TARGET]`, `capacity hold --kind K --target T --seconds N` and
 * `capacity demand`: host holds and the unmet-demand ledger, each with --json.
 */
export function registerHoldCommands(capacity: Command) {
  withConnection(
    capacity
      .command('list')
      .description(
        'One row per node, net of every live hold and reservation: whether it accepts work, running holds, CPU, RAM and VRAM free/total, what holds reserve, the admission reason and the age of its publication.',
      )
      .option('--tenant <tenant>', 'the tenant (default: your token’s)')
      .option('--pool <pool>', 'only this pool (id or name)'),
  ).action(
    apiAction<{ pool?: string }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      const poolId = options.pool ? await resolvePool(client, tenantId, options.pool) : undefined;
      const page = await client.capacity.nodes({ tenantId, ...(poolId ? { poolId } : {}) });
      out.result(page, (p) =>
        p.nodes.length === 0
          ? `no nodes in the pools offered to tenant ${tenantId}`
          : renderTable(p.nodes, [
              { header: 'TARGET', value: (n) => n.name },
              { header: 'ACCEPTS', value: (n) => (n.acceptingJobs ? 'yes' : 'no') },
              { header: 'WORKLOADS', value: (n) => n.runningWorkloads, right: true },
              { header: 'CPU', value: (n) => freeOf(n.availableCpuCores, n.vcpu.total), right: true },
              { header: 'RAM GIB', value: (n) => freeOf(n.freeRamGiB, n.memoryGiB.total), right: true },
              { header: 'VRAM GIB', value: (n) => shown(n.freeVramGiB), right: true },
              {
                header: 'RESERVED',
                value: (n) => `${n.reserved.cpuCores} cores, ${n.reserved.ramGiB} GiB`,
              },
              { header: 'REASON', value: (n) => n.admissionReason ?? '' },
              {
                header: 'AGE',
                value: (n) =>
                  n.publicationAgeSeconds === null
                    ? notReported
                    : formatDuration(n.publicationAgeSeconds * 1000),
              },
            ]),
      );
    }),
  );

  withConnection(
    capacity
      .command('holds [target]')
      .description(
        'The holds, live or ended within the last hour: on TARGET (a node id or name), or on every host.',
      )
      .option('--tenant <tenant>', 'the tenant (default: your token’s)'),
  ).action(
    apiAction<object>(async ({ options, client, out }, target) => {
      const tenantId = await tenantOf(client, options);
      const result = await client.holds.list({ tenantId, ...(target ? { target } : {}) });
      out.result(result, (r) =>
        r.holds.length === 0
          ? target
            ? `${target} holds no reservations`
            : 'no host holds a reservation'
          : renderTable(r.holds, [
              { header: 'HOLD', value: (h) => h.id },
              { header: 'TARGET', value: (h) => h.target },
              { header: 'KIND', value: (h) => h.kind },
              { header: 'STATE', value: (h) => h.state },
              { header: 'CPU', value: (h) => h.cpuCores, right: true },
              { header: 'RAM GIB', value: (h) => h.ramGiB, right: true },
              { header: 'HOLDER', value: (h) => h.holder },
              { header: 'ACQUIRED', value: (h) => formatTime(h.acquiredAt) ?? '' },
              { header: 'UNTIL', value: (h) => formatTime(h.endedAt ?? h.expiresAt) ?? '' },
            ]),
      );
    }),
  );

  withConnection(
    capacity
      .command('hold')
      .description(
        "Takes a kind's declared hold on a host, heartbeats it for N seconds and releases it; prints the receipt (with --json). Refused with the exact sentence when the host has no room.",
      )
      .addOption(required('--kind <kind>', 'the workload kind (see capacity kinds)'))
      .addOption(required('--target <target>', 'the node (id or name)'))
      .addOption(required('--seconds <n>', 'how long to hold it').argParser(parse.positiveInt))
      .option('--tenant <tenant>', 'the tenant (default: your token’s)'),
  ).action(
    apiAction<{ kind: string; target: string; seconds: number }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      const heartbeatSeconds = Math.min(60, Math.max(1, Math.floor(options.seconds / 3)));
      const taken = await withHold(
        client,
        options.kind,
        options.target,
        async (hold, lost) => {
          out.progress(
            `holding ${hold.kind} on ${hold.target} (${hold.cpuCores} cores, ${hold.ramGiB} GiB) as ${hold.id} for ${options.seconds}s`,
          );
          // wall time: how long the operator asked to hold, not a decision
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, options.seconds * 1000);
            lost.addEventListener('abort', () => {
              clearTimeout(timer);
              resolve();
            });
          });
          if (lost.aborted) throw lost.reason;
          return hold;
        },
        { tenantId, path: `hold ${options.seconds}s`, heartbeatSeconds },
      );
      const receipt = await client.holds.get({ tenantId, holdId: taken.id });
      out.result(receipt, (h) =>
        renderFields([
          ['hold', h.id],
          ['target', h.target],
          ['kind', h.kind],
          ['holder', h.holder],
          ['held', `${h.cpuCores} cores, ${h.ramGiB} GiB${h.vramGiB ? `, ${h.vramGiB} GiB VRAM` : ''}`],
          ['acquired', formatTime(h.acquiredAt)],
          ['state', h.state],
          ['ended', formatTime(h.endedAt)],
        ]),
      );
    }),
  );

  withConnection(
    capacity
      .command('kinds')
      .description('The workload kinds of the pools offered to the tenant, and what one hold of each takes.')
      .option('--tenant <tenant>', 'the tenant (default: your token’s)')
      .option('--pool <pool>', 'only this pool (id or name)'),
  ).action(
    apiAction<{ pool?: string }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      const result = await client.holds['kinds.list']({
        tenantId,
        ...(options.pool ? { pool: options.pool } : {}),
      });
      out.result(result, (r) =>
        r.kinds.length === 0
          ? 'no pool offered to this tenant declares a workload kind (declare one with holds.kinds.set)'
          : renderTable(r.kinds, [
              { header: 'POOL', value: (k) => k.poolId },
              { header: 'KIND', value: (k) => k.name },
              { header: 'CPU', value: (k) => k.cpuCores, right: true },
              { header: 'RAM GIB', value: (k) => k.ramGiB, right: true },
              { header: 'VRAM GIB', value: (k) => k.vramGiB, right: true },
              { header: 'TTL', value: (k) => `${k.ttlSeconds ?? 180}s`, right: true },
            ]),
      );
    }),
  );

  withConnection(
    capacity
      .command('demand')
      .description(
        'Unmet demand over a window: refused holds and pending or refused reservations by shape, pool, tenant and reason, the top unmet shapes, and why each pending reservation waits (blocking reasons, queue place, earliest start).',
      )
      .option('--tenant <tenant>', 'the tenant (default: your token’s)')
      .option('--pool <pool>', 'only this pool (id or name)')
      .option('--window <duration>', 'how far back (default 7d)', parse.duration),
  ).action(
    apiAction<{ pool?: string; window?: number }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      const poolId = options.pool ? await resolvePool(client, tenantId, options.pool) : undefined;
      const report = await client.capacity.demand({
        tenantId,
        ...(poolId ? { poolId } : {}),
        ...(options.window ? { windowSeconds: Math.max(60, Math.round(options.window / 1000)) } : {}),
      });
      out.result(report, (r) => {
        const counts = (title: string, rows: Array<{ key: string; count: number }>) =>
          rows.length === 0 ? [] : [`${title}:`, ...rows.map((x) => `  ${x.count}  ${x.key}`)];
        return [
          `unmet requests from ${formatTime(r.window.start)} to ${formatTime(r.window.end)}: ${r.total}`,
          ...counts('by reason', r.byReason),
          ...counts('by pool', r.byPool),
          ...counts('by tenant', r.byTenant),
          ...(r.topShapes.length
            ? [
                'top unmet shapes:',
                ...r.topShapes.map((s) => `  ${s.count}  ${s.shape}  (${s.poolId ?? 'no pool'})`),
              ]
            : []),
          ...(r.pending.length
            ? [
                'pending:',
                ...r.pending.map(
                  (p) =>
                    `  ${p.reservationId}  ${p.shape}  queue ${p.queuePosition}/${p.queueLength}  earliest ${
                      formatTime(p.earliestStart) ?? 'none within 14 days'
                    }\n    ${p.blocking.map((b) => b.message).join(', ') || p.message}`,
                ),
              ]
            : []),
        ].join('\n');
      });
    }),
  );
}
