import type { Command } from 'commander';
import type { Methods } from '../../api/registry.ts';
import type { MethodOutput } from '../../client/index.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { formatAge, formatTime, renderFields, renderTable } from '../output.ts';
import { registerNodeMigCommand } from './nodes-mig.ts';

type NodeView = MethodOutput<Methods, 'nodes', 'get'>;

/** Why a node takes no new work, or null when it does. */
function refusal(n: NodeView): string | null {
  const reasons: string[] = [];
  if (n.provisionState !== 'ready') reasons.push(n.provisionState);
  if (n.draining) reasons.push(n.drained ? 'drained' : 'draining');
  else if (n.cordoned) reasons.push(`cordoned${n.cordonReason ? ` (${n.cordonReason})` : ''}`);
  if (n.connectivity !== 'connected') reasons.push(n.connectivity);
  for (const taint of n.taints) reasons.push(`tainted (${taint})`);
  for (const c of n.conditions) {
    if (n.taints.some((t) => c.type === `Taint:${t}`)) continue;
    // Conditions that restate an axis already named (Draining, Cordoned) add nothing.
    if (c.effect === 'NoSchedule' && !reasons.some((r) => r.startsWith(c.type.toLowerCase()))) {
      reasons.push(`${c.type}: ${c.reason}`);
    }
  }
  return reasons.length ? reasons.join(', ') : null;
}

function renderNode(n: NodeView): string {
  const lines = [
    renderFields([
      ['id', n.id],
      ['name', n.name],
      ['pool', n.poolId],
      ['site', n.siteId],
      ['state', n.provisionState],
      ['accepts work', refusal(n) === null],
      ['refuses because', refusal(n)],
      ['maintenance', n.maintenance ? (n.maintenanceReason ?? 'yes') : 'no'],
      ['taints', n.taints.length ? n.taints.join(', ') : 'none'],
      ...(n.draining
        ? [
            [
              'drain',
              n.drainedAt ? `drained at ${formatTime(n.drainedAt)}` : 'draining (allocations remain)',
            ] as [string, string],
          ]
        : []),
      ['connectivity', n.connectivity],
      [
        'last heartbeat',
        n.lastHeartbeatAt
          ? `${formatTime(n.lastHeartbeatAt)} (${formatAge(n.lastHeartbeatAt)})`
          : 'not reported',
      ],
      ['agent', n.agentVersion ?? 'not reported'],
      ['spec generation', `${n.observedGeneration ?? 'not reported'} of ${n.specGeneration}`],
      ['certificate until', formatTime(n.certificateNotAfter)],
      ['GPUs', n.gpuCount],
    ]),
  ];
  if (n.conditions.length) {
    lines.push('conditions:');
    for (const c of n.conditions)
      lines.push(`  ${c.type} (${c.reason})${c.effect ? ` ${c.effect}` : ''}: ${c.message}`);
  }
  if (n.labels.length) {
    lines.push('labels:');
    for (const l of n.labels) lines.push(`  ${l.key}=${l.value} (${l.source})`);
  }
  if (n.devices?.length) {
    lines.push('devices:');
    for (const d of n.devices) lines.push(`  ${d.id}  ${d.class}  ${d.stableId}  ${d.health}`);
  }
  if (n.calendarBookings?.length) {
    // Booked ahead: BookingRepair moves them before their start while the node refuses work.
    lines.push(`calendar bookings${refusal(n) ? ' (at risk: the node takes no new work)' : ''}:`);
    for (const b of n.calendarBookings) {
      lines.push(
        `  ${formatTime(b.start)} → ${formatTime(b.end)}  ${b.reservationId}  ${b.tenantId}  ${b.atoms} atom(s)`,
      );
    }
  }
  return lines.join('\n');
}

/**
 * `nodes list|get|cordon|uncordon|drain|taint|untaint|retire|revoke-certificates|approve-reclaim`,
 * `join-tokens create|list|revoke`.
 */
export function registerNodeCommands(program: Command) {
  const nodes = program.command('nodes').description('The servers of the fleet.');
  withConnection(
    nodes
      .command('list')
      .description('Nodes you may see, newest first.')
      .option('--pool <pool>', 'only this pool’s')
      .option('--connectivity <state>', 'connected, unreachable or unknown')
      .option('--limit <n>', 'at most this many (default 100)', parse.positiveInt)
      .option('--cursor <id>', 'continue after this node'),
  ).action(
    apiAction<{ pool?: string; connectivity?: string; limit?: number; cursor?: string }>(
      async ({ options, client, out }) => {
        const page = await client.nodes.list({
          ...(options.pool ? { poolId: options.pool } : {}),
          ...(options.connectivity ? { connectivity: options.connectivity as never } : {}),
          ...(options.limit ? { limit: options.limit } : {}),
          ...(options.cursor ? { cursor: options.cursor } : {}),
        });
        out.result(page, (p) =>
          [
            p.nodes.length === 0
              ? 'no nodes'
              : renderTable(p.nodes, [
                  { header: 'ID', value: (n) => n.id },
                  { header: 'NAME', value: (n) => n.name },
                  { header: 'POOL', value: (n) => n.poolId },
                  { header: 'GPUS', value: (n) => n.gpuCount, right: true },
                  { header: 'ACCEPTS', value: (n) => refusal(n) === null },
                  { header: 'WHY NOT', value: (n) => refusal(n) },
                  { header: 'HEARTBEAT', value: (n) => formatAge(n.lastHeartbeatAt) ?? 'not reported' },
                ]),
            ...(p.nextCursor ? [`more: --cursor ${p.nextCursor}`] : []),
          ].join('\n'),
        );
      },
    ),
  );
  withConnection(
    nodes.command('get').description('One node, with its devices.').argument('<node-id>'),
  ).action(
    apiAction(async ({ client, out }, id) => {
      const node = await client.nodes.get({ nodeId: id! });
      out.result(node, renderNode);
    }),
  );
  for (const [verb, description] of [
    ['cordon', 'Stop new placements on a node; what runs keeps running.'],
    ['uncordon', 'Let placements reach the node again (clears cordon, drain and a finished drain).'],
    [
      'drain',
      'Cordon the node and mark it draining; it is drained (event node.drained) once its last allocation ends. Nothing is released.',
    ],
  ] as const) {
    const command = nodes.command(verb).description(description).argument('<node-id>');
    if (verb !== 'uncordon') command.option('--reason <text>', 'why, for the audit trail and `nodes get`');
    withConnection(command).action(
      apiAction<{ reason?: string }>(async ({ options, client, out }, id) => {
        const result =
          verb === 'uncordon'
            ? await client.nodes.uncordon({ nodeId: id! })
            : await client.nodes[verb]({
                nodeId: id!,
                ...(options.reason ? { reason: options.reason } : {}),
              });
        out.result(
          result,
          (r) =>
            `${r.node.name} (${r.node.id}): ${refusal(r.node) ?? 'accepts work'}; ${r.liveAllocations} live allocation(s), ${r.calendarBookings} calendar booking(s)${r.message ? `\n${r.message}` : ''}`,
        );
      }),
    );
  }
  for (const [verb, description] of [
    ['taint', 'Taint a node with a named NoSchedule reason: no new placements; what runs keeps running.'],
    ['untaint', 'Remove the taint of that reason from a node.'],
  ] as const) {
    withConnection(
      nodes
        .command(verb)
        .description(description)
        .argument('<node-id>')
        .addOption(required('--reason <name>', 'the taint’s name (shown as the condition Taint:<name>)')),
    ).action(
      apiAction<{ reason: string }>(async ({ options, client, out }, id) => {
        const result = await client.nodes[verb]({ nodeId: id!, reason: options.reason });
        out.result(
          result,
          (r) =>
            `${r.node.name} (${r.node.id}): ${r.changed ? (verb === 'taint' ? 'tainted' : 'untainted') : 'unchanged'} (${options.reason}); ${refusal(r.node) ?? 'accepts work'}`,
        );
      }),
    );
  }

  withConnection(
    nodes
      .command('retire')
      .description(
        'Retire a node: certificates revoked, session ended, hardware key freed; refused while live allocations hold it unless --force.',
      )
      .argument('<node-id>')
      .option('--force', 'retire it even though live allocations hold it (they are not released)')
      .option('--reason <text>', 'why, for the audit trail and `nodes get`'),
  ).action(
    apiAction<{ force?: boolean; reason?: string }>(async ({ options, client, out }, id) => {
      const result = await client.nodes.retire({
        nodeId: id!,
        ...(options.force ? { force: true } : {}),
        ...(options.reason ? { reason: options.reason } : {}),
      });
      out.result(
        result,
        (r) =>
          `${r.node.name} (${r.node.id}): ${r.changed ? 'retired' : 'already retired'}; ${r.revokedCertificates} certificate(s) revoked; ${r.liveAllocations} live allocation(s)`,
      );
    }),
  );
  withConnection(
    nodes
      .command('revoke-certificates')
      .description('Revoke every certificate of a node; its session ends within 15 s and it must join again.')
      .argument('<node-id>')
      .option('--reason <text>', 'why, for the audit trail'),
  ).action(
    apiAction<{ reason?: string }>(async ({ options, client, out }, id) => {
      const result = await client.nodes.revokeCertificates({
        nodeId: id!,
        ...(options.reason ? { reason: options.reason } : {}),
      });
      out.result(
        result,
        (r) => `${r.node.name} (${r.node.id}): ${r.revokedCertificates} certificate(s) revoked`,
      );
    }),
  );
  withConnection(
    nodes
      .command('approve-reclaim')
      .description(
        "Let the machine with this node's hardware key take the node back at its next join, without its old key.",
      )
      .argument('<node-id>')
      .option('--ttl <duration>', 'how long the approval holds (default 1h, at most 7d)', parse.duration),
  ).action(
    apiAction<{ ttl?: number }>(async ({ options, client, out }, id) => {
      const result = await client.nodes.approveReclaim({
        nodeId: id!,
        ...(options.ttl !== undefined ? { ttlSeconds: Math.round(options.ttl / 1000) } : {}),
      });
      out.result(
        result,
        (r) => `${r.node.name} (${r.node.id}): may be reclaimed until ${formatTime(r.reclaimApprovedUntil)}`,
      );
    }),
  );
  registerNodeMigCommand(nodes);

  const joinTokens = program.command('join-tokens').description('Tokens that let a new server join a pool.');
  withConnection(
    joinTokens
      .command('create')
      .description('A join token for a pool; the secret is shown once.')
      .addOption(required('--pool <pool>', 'the pool the machine joins'))
      .option('--ttl <duration>', 'how long it is valid (default 1h, at most 30d)', parse.duration)
      .option('--max-uses <n>', 'how many machines may join with it (default 1)', parse.positiveInt),
  ).action(
    apiAction<{ pool: string; ttl?: number; maxUses?: number }>(async ({ options, client, out }) => {
      const token = await client.joinTokens.create({
        poolId: options.pool,
        ...(options.ttl !== undefined ? { ttlSeconds: Math.round(options.ttl / 1000) } : {}),
        ...(options.maxUses !== undefined ? { maxUses: options.maxUses } : {}),
      });
      out.result(token, (t) =>
        [
          renderFields([
            ['id', t.id],
            ['pool', t.poolId],
            ['expires', formatTime(t.expiresAt)],
            ['uses', `${t.uses} of ${t.maxUses}`],
          ]),
          '',
          t.token,
          '',
          `On the new server: bcd join --token ${t.token} …  (shown once)`,
        ].join('\n'),
      );
    }),
  );
  withConnection(
    joinTokens
      .command('list')
      .description('Join tokens of the pools you manage (never their secrets).')
      .option('--pool <pool>', 'only this pool’s'),
  ).action(
    apiAction<{ pool?: string }>(async ({ options, client, out }) => {
      const page = await client.joinTokens.list({ ...(options.pool ? { poolId: options.pool } : {}) });
      out.result(page, (p) =>
        p.tokens.length === 0
          ? 'no join tokens'
          : renderTable(p.tokens, [
              { header: 'ID', value: (t) => t.id },
              { header: 'POOL', value: (t) => t.poolId },
              { header: 'STATE', value: (t) => t.state },
              { header: 'USES', value: (t) => `${t.uses}/${t.maxUses}`, right: true },
              { header: 'EXPIRES', value: (t) => formatTime(t.expiresAt) },
            ]),
      );
    }),
  );
  withConnection(
    joinTokens.command('revoke').description('Revoke a join token.').argument('<token-id>'),
  ).action(
    apiAction(async ({ client, out }, id) => {
      const token = await client.joinTokens.revoke({ tokenId: id! });
      out.result(token, (t) => `revoked ${t.id}`);
    }),
  );
}
