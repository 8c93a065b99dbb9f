import type { Methods } from '../api/registry.ts';
import type { MethodOutput } from '../client/index.ts';
import { formatDuration } from '../domain/duration.ts';
import { formatTime, renderFields, renderTable } from './output.ts';

export type Reservation = MethodOutput<Methods, 'reservations', 'get'>;

function window(r: Reservation): string | null {
  if (!r.during) return null;
  return `${formatTime(r.during.start)} → ${formatTime(r.during.end)} (${formatDuration(r.during.end - r.during.start)})`;
}

function devicesOf(r: Reservation): string {
  const d = (
    r.request.devices as Array<{ class: string; count: number; topology?: string }> | undefined
  )?.[0];
  return d ? `${d.count} × ${d.class}${d.topology === 'nvlink-all' ? ' (nvlink)' : ''}` : '-';
}

/** One reservation for people. */
export function renderReservation(r: Reservation): string {
  const fields: Array<[string, string | number | null]> = [
    ['id', r.id],
    ['state', r.state],
    ['tenant', r.tenantId],
    ['pool', r.poolId],
    ['devices', devicesOf(r)],
    ['window', window(r)],
    ['nodes', [...new Set(r.allocations.map((a) => a.nodeId))].join(', ') || null],
    [
      'operation',
      `${r.operation.state}${r.operation.error ? ` (${r.operation.error.code}: ${r.operation.error.message})` : ''}`,
    ],
    ['key', r.idempotencyKey],
  ];
  if (r.lease) fields.push(['lease', `${r.lease.seconds}s, expires ${formatTime(r.lease.expiresAt) ?? '-'}`]);
  if (r.endReason) fields.push(['ended', r.endReason]);
  if (r.binding) fields.push(['binding', JSON.stringify(r.binding)]);
  const lines = [renderFields(fields)];
  if (r.conditions.length > 0) {
    lines.push('conditions:');
    for (const c of r.conditions) lines.push(`  ${c.type} (${c.reason}): ${c.message}`);
  }
  return lines.join('\n');
}

export function renderReservationTable(items: readonly Reservation[]): string {
  return renderTable(items, [
    { header: 'ID', value: (r) => r.id },
    { header: 'STATE', value: (r) => r.state },
    { header: 'POOL', value: (r) => r.poolId },
    { header: 'DEVICES', value: devicesOf },
    { header: 'START', value: (r) => formatTime(r.during?.start) },
    { header: 'END', value: (r) => formatTime(r.during?.end) },
    { header: 'CONDITIONS', value: (r) => r.conditions.map((c) => c.type).join(',') },
  ]);
}

/**
 * A dotted path into an object, as `--query` takes it: `binding`, `binding.nodeId`,
 * `allocations[0].nodeId`, `during.end`.
 */
export function queryPath(value: unknown, path: string): { found: boolean; value: unknown } {
  const parts = path.match(/[^.[\]]+/g) ?? [];
  let current: unknown = value;
  for (const part of parts) {
    if (current === null || typeof current !== 'object' || !(part in (current as object))) {
      return { found: false, value: undefined };
    }
    current = (current as Record<string, unknown>)[part];
  }
  return { found: true, value: current };
}
