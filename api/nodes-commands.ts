import { z } from 'zod';
import { insertAuditEvent } from '../db/events/audit.ts';
import { insertOutboxEvent } from '../db/events/outbox.ts';
import {
  type CommandView,
  enqueueNodeCommand,
  findNodeCommand,
  listNodeCommands,
} from '../db/nodes/commands.ts';
import { commandKinds, operatorCommandKindNames } from '../domain/command-kinds.ts';
import { ComputeError } from '../domain/errors.ts';
import { defineMethod } from './method.ts';
import { requireNode } from './nodes-access.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');

const commandView = z.object({
  id: z.string(),
  nodeId: z.string(),
  seq: z.number().int(),
  kind: z.string(),
  lane: z.enum(['control', 'provision', 'bulk']),
  state: z.enum(['queued', 'delivered', 'running', 'succeeded', 'failed', 'expired', 'cancelled']),
  payload: z.record(z.string(), z.unknown()),
  result: z.record(z.string(), z.unknown()).nullable(),
  error: z.string().nullable(),
  createdAt: z.number(),
  deliveredAt: z.number().nullable(),
  completedAt: z.number().nullable(),
});

function view(c: CommandView): z.infer<typeof commandView> {
  return {
    ...c,
    createdAt: c.createdAt.getTime(),
    deliveredAt: c.deliveredAt?.getTime() ?? null,
    completedAt: c.completedAt?.getTime() ?? null,
  };
}

/**
 * One variant per kind an operator may queue, discriminated on `kind`, each with its kind's own
 * payload schema (domain/command-kinds.ts), so the OpenAPI document states every payload. A
 * payload its kind accepts empty may be left out (`{}`, its defaults applied); otherwise it is
 * required.
 */
const commandVariants = operatorCommandKindNames.map((kind) => {
  const payload: z.ZodType<Record<string, unknown>> = commandKinds[kind].payload;
  return z.strictObject({
    nodeId,
    kind: z.literal(kind),
    payload: payload.safeParse({}).success ? payload.prefault({}) : payload,
    /** The command is never run after this many seconds (default 10 minutes). */
    notAfterSeconds: z.number().int().min(1).max(86_400).default(600),
  });
});
const commandInput = z.discriminatedUnion(
  'kind',
  commandVariants as [(typeof commandVariants)[number], ...typeof commandVariants],
);

const command = defineMethod({
  summary: 'Send a one-shot command to a node (durable, delivered in order within its lane).',
  action: 'compute:nodes:command',
  input: commandInput,
  output: commandView,
  handler: async (ctx, input) => {
    const scope = await requireNode(ctx, input.nodeId, 'compute:nodes:command');
    // The command as this call queued it, read in its own transaction: once committed it may be
    // delivered at once, and the answer would say so only some of the time.
    const queued = await ctx.deps.db.transaction().execute(async (trx) => {
      const enqueued = await enqueueNodeCommand(trx, {
        nodeId: input.nodeId,
        kind: input.kind,
        payload: input.payload,
        notAfterSeconds: input.notAfterSeconds,
      });
      await insertOutboxEvent(trx, {
        type: 'node.command-queued',
        subject: `node/${input.nodeId}`,
        tenantId: scope.tenantId,
        data: { nodeId: input.nodeId, commandId: enqueued.id, kind: input.kind, seq: enqueued.seq },
      });
      await insertAuditEvent(trx, {
        tenantId: scope.tenantId,
        actorIdentityId: ctx.principal.identityId,
        action: 'compute:nodes:command',
        resourceType: 'compute-node',
        resourceId: input.nodeId,
        requestId: ctx.requestId,
        context: { kind: input.kind, commandId: enqueued.id },
      });
      return (await findNodeCommand(trx, enqueued.id))!;
    });
    return view(queued);
  },
});

const getCommand = defineMethod({
  summary: "One command of a node: its state, result or error (poll it until it's done).",
  action: 'compute:nodes:read',
  input: z.strictObject({
    nodeId,
    commandId: z.string().regex(/^cmd_[0-9a-z]{26}$/, 'a command id (cmd_…)'),
  }),
  output: commandView,
  handler: async (ctx, input) => {
    await requireNode(ctx, input.nodeId, 'compute:nodes:read');
    const found = await findNodeCommand(ctx.deps.db, input.commandId);
    if (!found || found.nodeId !== input.nodeId) {
      throw new ComputeError('NOT_FOUND', `command ${input.commandId} not found on node ${input.nodeId}`);
    }
    return view(found);
  },
});

const listCommands = defineMethod({
  summary: 'The commands of a node, newest first.',
  action: 'compute:nodes:read',
  input: z.strictObject({ nodeId, limit: z.number().int().min(1).max(200).default(50) }),
  output: z.object({ commands: z.array(commandView) }),
  handler: async (ctx, input) => {
    await requireNode(ctx, input.nodeId, 'compute:nodes:read');
    const commands = await listNodeCommands(ctx.deps.db, input.nodeId, input.limit);
    return { commands: commands.map(view) };
  },
});

export const nodeCommandMethods = { command, getCommand, listCommands };
