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
  const gang = (r.request.gang as { size: number } | undefined)?.size;
  return d
    ? `${gang ? `${gang} nodes × ` : ''}${d.count} × ${d.class}${d.topology === 'nvlink-all' ? ' (nvlink)' : ''}`
    : '-';
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
  if (r.state === 'releasing') {
    fields.push([
      'releasing',
      'pods still hold its GPUs; the release finishes when the node reports them free',
    ]);
  }
  if (r.lease) fields.push(['lease', `${r.lease.seconds}s, expires ${formatTime(r.lease.expiresAt) ?? '-'}`]);
  if (r.endReason) fields.push(['ended', r.endReason]);
  if (r.binding) fields.push(['binding', JSON.stringify(r.binding)]);
  if ((r.request as { spot?: boolean }).spot) fields.push(['spot', 'yes (billed on the spot meter)']);
  const preempted = r.conditions.find((c) => c.type === 'Preempted' && c.deadline !== undefined);
  if (preempted) {
    fields.push([
      'preempted',
      `released at ${formatTime(preempted.deadline)}${preempted.preemptedBy ? ` for ${preempted.preemptedBy}` : ''}`,
    ]);
  }
  const lines = [renderFields(fields)];
  if (r.gang) lines.push(...renderGang(r));
  if (r.conditions.length > 0) {
    lines.push('conditions:');
    for (const c of r.conditions) {
      const since = c.since === undefined ? '' : ` (since ${formatTime(c.since)})`;
      lines.push(`  ${c.type} (${c.reason}): ${c.message}${since}`);
    }
  }
  if (r.repairs.length > 0) {
    lines.push('booking repairs:');
    for (const repair of r.repairs) lines.push(...renderRepair(repair));
  }
  return lines.join('\n');
}

/** One BookingRepair: what moved from where to where, or why nothing could. */
function renderRepair(repair: Reservation['repairs'][number]): string[] {
  const head = `  ${formatTime(repair.at)} ${repair.moment}: ${repair.outcome}`;
  if (repair.outcome === 'failed') return [`${head}: ${repair.message ?? ''}`];
  return [
    head,
    ...repair.moves.map(
      (m) =>
        `    ${m.fromNodeName} → ${m.toNodeName} (${m.reason}; ${m.fromDeviceIds.length} atom(s), allocation ${m.toAllocationId})`,
    ),
  ];
}

/** A gang's topology and one line per member: its number, node, state and devices. */
function renderGang(r: Reservation): string[] {
  const gang = r.gang!;
  const topology = gang.topologyKey ? `, ${gang.topologyKey}=${gang.topologyValue ?? '-'}` : '';
  return [
    `gang: ${gang.size} nodes${topology}`,
    ...r.allocations.map(
      (a) =>
        `  member ${a.gangIndex ?? '-'}  ${a.nodeName ?? a.nodeId} (${a.nodeId})  ${a.state}  ${a.deviceIds.length} device(s)  ${a.id}`,
    ),
  ];
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
