import { z } from 'zod';
import {
  enqueueBmcCommand,
  findMachine,
  insertEnrolledMachine,
  listMachines,
  type MachineView,
} from '../../db/metal/bmc.ts';
import { insertMetalWorkflow } from '../../db/metal/workflows.ts';
import { type CommandView, findNodeCommand } from '../../db/nodes/commands.ts';
import { findSite, listPoolIdsOwnedBy } from '../../db/nodes/fleet.ts';
import { ComputeError } from '../../domain/errors.ts';
import { bmcAddressSchema, bmcBootDevices, bmcPowerActions, fetchUrlSchema } from '../../domain/metal-bmc.ts';
import { planInspect } from '../../domain/metal-steps.ts';
import { defineMethod, type MethodContext } from '../method.ts';
import { requireNode, requirePool, requireTenantRead } from '../nodes-access.ts';
import { apiSealer } from '../sealer.ts';
import { provisioningMethods, startMetalTemporalWorkflow } from './provisioning.ts';

const nodeId = z.string().regex(/^node_[0-9a-z]{26}$/, 'a node id (node_…)');
const waitSeconds = z.number().int().min(0).max(120).default(60);

const machineOut = z.object({
  nodeId: z.string(),
  name: z.string(),
  siteId: z.string(),
  poolId: z.string().nullable(),
  provisionState: z.string(),
  bmc: z.object({
    address: z.string(),
    systemId: z.string(),
    username: z.string(),
    powerState: z.enum(['on', 'off', 'unknown']).nullable(),
    bootDevice: z.string().nullable(),
    lastError: z.string().nullable(),
    observedAt: z.number().nullable(),
  }),
});

function machineView(m: MachineView): z.infer<typeof machineOut> {
  return { ...m, bmc: { ...m.bmc, observedAt: m.bmc.observedAt?.getTime() ?? null } };
}

const systemOut = z.object({
  systemId: z.string(),
  name: z.string().nullable(),
  uuid: z.string().nullable(),
  powerState: z.enum(['on', 'off', 'unknown']),
  redfishPowerState: z.string().nullable(),
  bootDevice: z.enum(bmcBootDevices).nullable(),
  bootOverride: z.string().nullable(),
  macs: z.array(z.string()),
  virtualMedia: z.array(z.object({ id: z.string(), inserted: z.boolean(), image: z.string().nullable() })),
});

const bmcAnswer = z.object({
  commandId: z.string(),
  /** `queued`/`delivered`/`running` when waitSeconds ran out first: poll nodes.getCommand on the agent. */
  state: z.enum(['queued', 'delivered', 'running', 'succeeded', 'failed', 'expired', 'cancelled']),
  siteAgentNodeId: z.string(),
  leaseEpoch: z.number().int(),
  system: systemOut.nullable(),
  error: z.string().nullable(),
});

/** The address as an origin (`https://host:port`); one WHATWG URL will not parse is kept as given. */
function bmcOrigin(address: string): string {
  try {
    return new URL(address).origin;
  } catch {
    return address.replace(/\/$/, '');
  }
}

const terminal = new Set(['succeeded', 'failed', 'expired', 'cancelled']);

/**
 * Queues one `bmc.*` command on the site's boot server and waits at most `waitSeconds` for its
 * answer, or until the caller goes away (a bounded wait on an operation; the command goes on
 * without the caller).
 */
async function runBmc(
  ctx: MethodContext,
  input: {
    nodeId: string;
    kind: 'bmc.power' | 'bmc.boot' | 'bmc.media' | 'bmc.inventory';
    args: Record<string, unknown>;
    waitSeconds: number;
  },
): Promise<z.infer<typeof bmcAnswer>> {
  await requireNode(ctx, input.nodeId, 'compute:nodes:command');
  const queued = await ctx.deps.db.transaction().execute((trx) =>
    enqueueBmcCommand(trx, {
      machineNodeId: input.nodeId,
      kind: input.kind,
      args: input.args,
      notAfterSeconds: 600,
    }),
  );
  const deadline = Date.now() + input.waitSeconds * 1000; // wall time: the caller's bounded wait
  let command: CommandView | null = await findNodeCommand(ctx.deps.db, queued.commandId);
  // wall time: a bounded wait for the command
  while (command && !terminal.has(command.state) && Date.now() < deadline && !ctx.signal.aborted) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    command = await findNodeCommand(ctx.deps.db, queued.commandId);
  }
  const result = command?.result as { system?: z.infer<typeof systemOut> } | null | undefined;
  return {
    commandId: queued.commandId,
    state: command?.state ?? 'queued',
    siteAgentNodeId: queued.siteAgentNodeId,
    leaseEpoch: queued.leaseEpoch,
    system: command?.state === 'succeeded' && result?.system ? result.system : null,
    error: command?.error ?? null,
  };
}

const enroll = defineMethod({
  summary:
    "Enroll a bare machine by its BMC: a node in `enrolling` in the pool, the BMC's password stored sealed (never shown again), and (unless `inspect: false`) its inspection workflow started: the ramdisk over the site agent's network boot reports the inventory and the node becomes `ready`. `inspection` names that workflow.",
  action: 'compute:nodes:join',
  input: z.strictObject({
    siteId: z.string().regex(/^site_[0-9a-z]{26}$/, 'a site id (site_…)'),
    poolId: z.string().min(1).max(100),
    name: z.string().regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, "a name: lower-case letters, digits, '.' or '-'"),
    bmc: z.strictObject({
      address: bmcAddressSchema,
      systemId: z.string().regex(/^[A-Za-z0-9._:-]{1,200}$/, 'a Redfish system id such as 1 or a UUID'),
      username: z.string().min(1).max(200),
      password: z.string().min(1).max(500),
    }),
    /** Start the inspection workflow (needs Temporal); false: the node waits in `enrolling` for metal.inspect. */
    inspect: z.boolean().default(true),
  }),
  output: machineOut.extend({ inspection: z.object({ workflowId: z.string() }).nullable() }),
  handler: async (ctx, input) => {
    const pool = await requirePool(ctx, input.poolId, 'compute:nodes:join');
    if (pool.archived) throw new ComputeError('INVALID_STATE', `pool ${input.poolId} is archived`);
    const site = await findSite(ctx.deps.db, { id: input.siteId });
    if (!site) throw new ComputeError('NOT_FOUND', `siteId: site ${input.siteId} does not exist`);
    const sealer = apiSealer(ctx.deps.config, "a BMC's credentials");
    if (input.inspect && !ctx.deps.temporal) {
      throw new ComputeError(
        'UNAVAILABLE',
        'inspection runs as a Temporal workflow and this server has no Temporal client: configure TEMPORAL_ADDRESS, or enroll with inspect: false',
      );
    }
    const enrolled = await ctx.deps.db.transaction().execute(async (trx) => {
      const machine = await insertEnrolledMachine(trx, {
        siteId: input.siteId,
        poolId: input.poolId,
        name: input.name,
        address: bmcOrigin(input.bmc.address),
        systemId: input.bmc.systemId,
        username: input.bmc.username,
        passwordSealed: sealer.seal('bmc-credential', input.bmc.password),
      });
      const inspection = input.inspect
        ? await insertMetalWorkflow(trx, {
            kind: 'inspect',
            nodeId: machine.nodeId,
            tenantId: pool.tenantId,
            profileId: null,
            profileVersion: null,
            idempotencyKey: 'enroll',
            steps: planInspect({ maxAttempts: 3 }),
            verb: 'metal.enroll',
          })
        : null;
      return { ...machine, inspection };
    });
    if (enrolled.inspection) await startMetalTemporalWorkflow(ctx, enrolled.inspection.workflowId);
    return {
      ...machineView((await findMachine(ctx.deps.db, enrolled.nodeId))!),
      inspection: enrolled.inspection ? { workflowId: enrolled.inspection.workflowId } : null,
    };
  },
});

const machines = defineMethod({
  summary:
    'Bare machines (nodes with a BMC) of the pools the caller manages, with what their BMC last reported.',
  action: 'compute:nodes:read',
  input: z.strictObject({ siteId: z.string().max(100).optional() }),
  output: z.object({ machines: z.array(machineOut) }),
  handler: async (ctx, input) => {
    await requireTenantRead(ctx, 'compute:nodes:read');
    let rows = await listMachines(ctx.deps.db, input.siteId ? { siteId: input.siteId } : {});
    if (!ctx.principal.rootAdmin) {
      const owned = new Set(await listPoolIdsOwnedBy(ctx.deps.db, ctx.principal.tenantId));
      rows = rows.filter((m) => m.poolId !== null && owned.has(m.poolId));
    }
    return { machines: rows.map(machineView) };
  },
});

const getMachine = defineMethod({
  summary: 'One bare machine and what its BMC last reported (never its credentials).',
  action: 'compute:nodes:read',
  input: z.strictObject({ nodeId }),
  output: machineOut,
  handler: async (ctx, input) => {
    await requireNode(ctx, input.nodeId, 'compute:nodes:read');
    const machine = await findMachine(ctx.deps.db, input.nodeId);
    if (!machine) throw new ComputeError('NOT_FOUND', `node ${input.nodeId} has no BMC: enroll it first`);
    return machineView(machine);
  },
});

const power = defineMethod({
  summary:
    'Power a bare machine on, off or reset it, through the site agent over Redfish; answers once the BMC shows the new state (or waitSeconds passed).',
  action: 'compute:nodes:command',
  input: z.strictObject({ nodeId, action: z.enum(bmcPowerActions), waitSeconds }),
  output: bmcAnswer,
  handler: (ctx, input) =>
    runBmc(ctx, {
      nodeId: input.nodeId,
      kind: 'bmc.power',
      args: { action: input.action },
      waitSeconds: input.waitSeconds,
    }),
});

const bootDevice = defineMethod({
  summary: 'Set the one-time boot device of a bare machine (pxe, disk or cd) through the site agent.',
  action: 'compute:nodes:command',
  input: z.strictObject({ nodeId, device: z.enum(bmcBootDevices), waitSeconds }),
  output: bmcAnswer,
  handler: (ctx, input) =>
    runBmc(ctx, {
      nodeId: input.nodeId,
      kind: 'bmc.boot',
      args: { device: input.device },
      waitSeconds: input.waitSeconds,
    }),
});

const virtualMedia = defineMethod({
  summary: "Insert an image (by URL, fetched by the BMC) into a bare machine's virtual CD, or eject it.",
  action: 'compute:nodes:command',
  input: z
    .strictObject({
      nodeId,
      action: z.enum(['insert', 'eject']),
      imageUrl: fetchUrlSchema.optional(),
      waitSeconds,
    })
    .refine((v) => v.action === 'eject' || v.imageUrl !== undefined, {
      message: 'insert needs imageUrl',
      path: ['imageUrl'],
    }),
  output: bmcAnswer,
  handler: (ctx, input) =>
    runBmc(ctx, {
      nodeId: input.nodeId,
      kind: 'bmc.media',
      args: { action: input.action, ...(input.imageUrl ? { imageUrl: input.imageUrl } : {}) },
      waitSeconds: input.waitSeconds,
    }),
});

const inventory = defineMethod({
  summary: "Read a bare machine's system inventory from its BMC (power, boot override, NICs, virtual media).",
  action: 'compute:nodes:read',
  input: z.strictObject({ nodeId, waitSeconds }),
  output: bmcAnswer,
  handler: (ctx, input) =>
    runBmc(ctx, { nodeId: input.nodeId, kind: 'bmc.inventory', args: {}, waitSeconds: input.waitSeconds }),
});

/** `metal.*`: bare machines and their BMCs, reached only through the site agent over Redfish. */
export const metalMethods = {
  enroll,
  machines,
  getMachine,
  power,
  bootDevice,
  virtualMedia,
  inventory,
  ...provisioningMethods,
};
