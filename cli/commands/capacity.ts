import type { Command } from 'commander';
import { formatDuration } from '../../domain/duration.ts';
import { apiAction, parse, withConnection } from '../command.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';
import { type RequestOptions, requestFromOptions, withRequestOptions } from '../reservation-request.ts';
import { resolvePool, tenantOf } from '../tenant.ts';
import { registerHoldCommands } from './holds.ts';

/** `capacity [--pool P]`, `capacity --preview …` (the flags of reserve). */
export function registerCapacityCommands(program: Command) {
  const capacity = withConnection(
    withRequestOptions(
      program
        .command('capacity')
        .description(
          'Per pool: allocatable, allocated, reserved and available devices. With --preview and the flags of reserve: what a reservation would get now, booking nothing.',
        )
        .enablePositionalOptions()
        .option('--tenant <tenant>', 'the tenant (default: your token’s)')
        .option('--preview', 'preview a reservation instead (takes the flags of reserve)'),
      false,
    ),
  ).action(
    apiAction<Partial<RequestOptions> & { preview?: boolean }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      if (options.pool) options.pool = await resolvePool(client, tenantId, options.pool);
      if (options.preview) {
        const preview = await client.capacity.preview(
          requestFromOptions(options as RequestOptions, tenantId),
        );
        out.result(preview, (p) => {
          const fields: Array<[string, string | number | null]> = [
            ['fits', p.fits ? 'yes' : 'no'],
            [
              'window',
              `${formatTime(p.window.start)} → ${formatTime(p.window.end)} (${formatDuration(p.window.end - p.window.start)})`,
            ],
          ];
          if (p.nodeId) fields.push(['node', p.nodeId]);
          if (p.deviceIds) fields.push(['devices', p.deviceIds.join(', ')]);
          fields.push(['host share', `${p.resources.vcpu} vCPU, ${p.resources.memoryGiB} GiB`]);
          if (p.message) fields.push(['why not', p.message]);
          if (!p.fits) fields.push(['earliest start', formatTime(p.earliestStart) ?? 'none within 14 days']);
          if (p.preemption) fields.push(['by preempting', p.preemption.message]);
          if (p.gang?.topologyValue) fields.push(['topology value', p.gang.topologyValue]);
          const members = (p.gang?.members ?? []).map(
            (m, i) => `  ${i}  ${m.nodeName} (${m.nodeId})  ${m.deviceIds.length} device(s)`,
          );
          const values = (p.gang?.values ?? []).map(
            (v) => `  ${v.value ?? '(any node)'}: ${v.rejected ?? `${v.fitting} of ${v.nodes} nodes fit`}`,
          );
          const quota = p.quota.map((q) => `${q.resource}: needs ${q.needed}, ${q.used} of ${q.limit} used`);
          return [
            renderFields(fields),
            ...(members.length ? ['gang members:', ...members] : []),
            ...(values.length ? ['topology values:', ...values] : []),
            ...(quota.length ? ['quota:', ...quota.map((q) => `  ${q}`)] : []),
          ].join('\n');
        });
        return;
      }
      const result = await client.capacity.get({
        tenantId,
        ...(options.pool ? { poolId: options.pool } : {}),
      });
      out.result(result, (r) =>
        r.pools.length === 0
          ? `no pool is offered to tenant ${tenantId}`
          : renderTable(r.pools, [
              { header: 'POOL', value: (p) => p.poolId },
              { header: 'NAME', value: (p) => p.name },
              { header: 'MODEL', value: (p) => p.gpuModel },
              { header: 'REGION', value: (p) => p.region },
              { header: 'NODES', value: (p) => `${p.schedulableNodes}/${p.nodes}`, right: true },
              { header: 'ALLOCATABLE', value: (p) => p.allocatable, right: true },
              { header: 'ALLOCATED', value: (p) => p.allocated, right: true },
              { header: 'RESERVED', value: (p) => p.reserved, right: true },
              { header: 'AVAILABLE', value: (p) => p.available, right: true },
              { header: 'QUOTA', value: (p) => `${p.quota.used}/${p.quota.limit}`, right: true },
            ]),
      );
    }),
  );
  registerNodeCapacityCommand(capacity);
  registerHoldCommands(capacity);
  return capacity;
}

type Amount = { total: number | null; free: number | null; reserved: number | null };
const notReported = 'not reported';
const freeOfTotal = (a: Amount) => (a.total === null ? notReported : `${a.free}/${a.total}`);

/** `capacity nodes [--pool P]`: one row per node, with what it never reported as `not reported`. */
function registerNodeCapacityCommand(capacity: Command) {
  withConnection(
    capacity
      .command('nodes')
      .description(
        'One row per node: whether it accepts work and why not, free/total GPUs, vCPUs and memory net of every live booking, what is reserved, and the age of its last heartbeat.',
      )
      .option('--tenant <tenant>', 'the tenant (default: your token’s)')
      .option('--pool <pool>', 'only this pool (id or name)')
      .option('--limit <n>', 'at most this many nodes (default 500)', parse.positiveInt)
      .option('--cursor <id>', 'continue after this node'),
  ).action(
    apiAction<{ pool?: string; limit?: number; cursor?: string }>(async ({ options, client, out }) => {
      const tenantId = await tenantOf(client, options);
      const poolId = options.pool ? await resolvePool(client, tenantId, options.pool) : undefined;
      const page = await client.capacity.nodes({
        tenantId,
        ...(poolId ? { poolId } : {}),
        ...(options.limit ? { limit: options.limit } : {}),
        ...(options.cursor ? { cursor: options.cursor } : {}),
      });
      out.result(page, (p) =>
        [
          p.nodes.length === 0
            ? `no nodes in the pools offered to tenant ${tenantId}`
            : renderTable(p.nodes, [
                { header: 'NODE', value: (n) => n.name },
                { header: 'ACCEPTS', value: (n) => n.acceptsWork },
                { header: 'GPUS', value: (n) => freeOfTotal(n.gpus), right: true },
                { header: 'VCPUS', value: (n) => freeOfTotal(n.vcpu), right: true },
                { header: 'MEMORY GIB', value: (n) => freeOfTotal(n.memoryGiB), right: true },
                {
                  header: 'RESERVED',
                  value: (n) =>
                    n.gpus.reserved === null
                      ? notReported
                      : `${n.gpus.reserved} GPU${n.vcpu.reserved ? `, ${n.vcpu.reserved} vCPU` : ''}${
                          n.memoryGiB.reserved ? `, ${n.memoryGiB.reserved} GiB` : ''
                        }`,
                },
                { header: 'WHY NOT', value: (n) => n.refusals.join('; ') },
                {
                  // Calendar bookings that start later; AT RISK when the node takes no new work.
                  header: 'CALENDAR',
                  value: (n) =>
                    n.calendarBookings.count === 0
                      ? ''
                      : `${n.calendarBookings.count} from ${formatTime(n.calendarBookings.nextStart)}${n.calendarBookings.atRisk ? ' AT RISK' : ''}`,
                },
                {
                  header: 'HEARTBEAT',
                  value: (n) =>
                    n.heartbeatAgeSeconds === null
                      ? notReported
                      : `${formatDuration(n.heartbeatAgeSeconds * 1000)} ago`,
                },
              ]),
          ...(p.nextCursor ? [`more: --cursor ${p.nextCursor}`] : []),
        ].join('\n'),
      );
    }),
  );
}
