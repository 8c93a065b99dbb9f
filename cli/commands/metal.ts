import type { Command } from 'commander';
import type { Methods } from '../../api/registry.ts';
import type { MethodOutput } from '../../client/index.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { CliError } from '../errors.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';
import { registerCatalogCommands, registerProvisioningCommands } from './metal-provisioning.ts';

type BmcAnswer = MethodOutput<Methods, 'metal', 'power'>;
type Machine = MethodOutput<Methods, 'metal', 'getMachine'>;

function renderAnswer(a: BmcAnswer): string {
  return renderFields([
    ['command', a.commandId],
    ['state', a.state],
    ['site agent', `${a.siteAgentNodeId} (boot lease epoch ${a.leaseEpoch})`],
    ['power', a.system ? `${a.system.powerState} (${a.system.redfishPowerState})` : null],
    ['boot override', a.system?.bootOverride ?? null],
    ['MACs', a.system?.macs.join(', ') ?? null],
    [
      'virtual media',
      a.system?.virtualMedia.map((m) => `${m.id}: ${m.inserted ? m.image : 'empty'}`).join(', ') ?? null,
    ],
    ['error', a.error],
  ]);
}

function renderMachine(m: Machine): string {
  return renderFields([
    ['node', m.nodeId],
    ['name', m.name],
    ['site', m.siteId],
    ['pool', m.poolId],
    ['state', m.provisionState],
    ['BMC', `${m.bmc.address} system ${m.bmc.systemId} as ${m.bmc.username}`],
    ['power', m.bmc.powerState ?? 'not read yet'],
    ['boot device', m.bmc.bootDevice],
    ['last BMC error', m.bmc.lastError],
    ['observed', formatTime(m.bmc.observedAt)],
  ]);
}

/** `sites create|list|get|token` (administrators of the platform). */
export function registerSiteCommands(program: Command) {
  const sites = program.command('sites').description('Sites, their site agents (bcd site) and boot lease.');
  withConnection(
    sites
      .command('create')
      .description('Create a site.')
      .argument('<name>', 'the site name')
      .addOption(required('--region <region>', 'its region, such as eu-west-1')),
  ).action(
    apiAction<{ region: string }>(async ({ client, out, options }, name) => {
      const site = await client.sites.create({ name: name!, region: options.region });
      out.result(site, (s) => `site ${s.name} (${s.id}) in ${s.region}`);
    }),
  );
  withConnection(sites.command('list').description('Every site.')).action(
    apiAction(async ({ client, out }) => {
      const result = await client.sites.list({});
      out.result(result, (r) =>
        r.sites.length === 0
          ? 'no sites'
          : renderTable(r.sites, [
              { header: 'ID', value: (s) => s.id },
              { header: 'NAME', value: (s) => s.name },
              { header: 'REGION', value: (s) => s.region },
            ]),
      );
    }),
  );
  withConnection(
    sites
      .command('get')
      .description('A site, its agents and its boot lease.')
      .argument('<siteId>', 'the site id'),
  ).action(
    apiAction(async ({ client, out }, siteId) => {
      const site = await client.sites.get({ siteId: siteId! });
      out.result(site, (s) =>
        [
          renderFields([
            ['id', s.id],
            ['name', s.name],
            ['region', s.region],
            [
              'boot lease',
              s.bootLease
                ? `${s.bootLease.name} held by ${s.bootLease.holderNodeId}, epoch ${s.bootLease.epoch}, ${s.bootLease.expired ? 'expired' : `until ${formatTime(s.bootLease.expiresAt)}`}`
                : 'never held: start bcd site',
            ],
          ]),
          s.agents.length === 0
            ? 'no site agents'
            : renderTable(s.agents, [
                { header: 'AGENT', value: (a) => a.nodeId },
                { header: 'NAME', value: (a) => a.name },
                { header: 'ROLE', value: (a) => a.role },
                { header: 'CONNECTIVITY', value: (a) => a.connectivity },
              ]),
        ].join('\n'),
      );
    }),
  );
  withConnection(
    sites
      .command('token')
      .description('A site join token for bcd site (shown once).')
      .argument('<siteId>', 'the site id')
      .option(
        '--max-uses <n>',
        'how many agents may join with it (boot server and standbys)',
        parse.positiveInt,
        2,
      )
      .option('--ttl <duration>', 'how long it is valid', parse.duration, 3_600_000),
  ).action(
    apiAction<{ maxUses: number; ttl: number }>(async ({ client, out, options }, siteId) => {
      const token = await client.sites.createToken({
        siteId: siteId!,
        maxUses: options.maxUses,
        ttlSeconds: Math.round(options.ttl / 1000),
      });
      out.result(
        token,
        (t) => `${t.token}\n\nwrite caCertificatePem (--json) to ca.pem, then:\n  ${t.command}`,
      );
    }),
  );
}

/**
 * `metal enroll|machines|machine|power|boot|media|inventory` (bare machines through the site agent),
 * `metal deploy|inspect|abort|retry|maintenance|workflows`, and the `images` and `profiles` commands.
 */
export function registerMetalCommands(program: Command) {
  const metal = program
    .command('metal')
    .description('Bare machines and their BMCs (through the site agent, over Redfish).');
  withConnection(
    metal
      .command('enroll')
      .description('Enroll a bare machine by its BMC (the password is stored sealed, never shown again).')
      .argument('<name>', 'the node name')
      .addOption(required('--site <siteId>', 'the site'))
      .addOption(required('--pool <poolId>', 'the pool'))
      .addOption(required('--bmc <url>', 'the BMC address, such as https://10.0.0.5'))
      .addOption(required('--system <id>', 'the Redfish system id'))
      .addOption(required('--username <name>', 'the BMC user'))
      .option('--password-env <var>', 'the environment variable holding the BMC password', 'BMC_PASSWORD')
      .option('--no-inspect', 'do not start the inspection (the node waits in enrolling for metal inspect)'),
  ).action(
    apiAction<{
      site: string;
      pool: string;
      bmc: string;
      system: string;
      username: string;
      passwordEnv: string;
      inspect: boolean;
    }>(async ({ client, out, options }, name) => {
      const password = process.env[options.passwordEnv];
      if (!password)
        throw new CliError(`set the BMC password in $${options.passwordEnv} (never on the command line)`);
      const machine = await client.metal.enroll({
        name: name!,
        siteId: options.site,
        poolId: options.pool,
        bmc: { address: options.bmc, systemId: options.system, username: options.username, password },
        inspect: options.inspect,
      });
      out.result(machine, renderMachine);
    }),
  );
  withConnection(
    metal.command('machines').description('Bare machines.').option('--site <siteId>', 'only this site'),
  ).action(
    apiAction<{ site?: string }>(async ({ client, out, options }) => {
      const result = await client.metal.machines(options.site ? { siteId: options.site } : {});
      out.result(result, (r) =>
        r.machines.length === 0
          ? 'no bare machines'
          : renderTable(r.machines, [
              { header: 'NODE', value: (m) => m.nodeId },
              { header: 'NAME', value: (m) => m.name },
              { header: 'STATE', value: (m) => m.provisionState },
              { header: 'POWER', value: (m) => m.bmc.powerState ?? '-' },
              { header: 'BOOT', value: (m) => m.bmc.bootDevice ?? '-' },
              { header: 'BMC', value: (m) => m.bmc.address },
              { header: 'ERROR', value: (m) => m.bmc.lastError ?? '' },
            ]),
      );
    }),
  );
  withConnection(
    metal.command('machine').description('One bare machine.').argument('<nodeId>', 'the node id'),
  ).action(
    apiAction(async ({ client, out }, nodeId) => {
      out.result(await client.metal.getMachine({ nodeId: nodeId! }), renderMachine);
    }),
  );
  withConnection(
    metal
      .command('power')
      .description('Power a machine on, off or reset it; waits until the BMC shows it.')
      .argument('<nodeId>', 'the node id')
      .argument('<action>', 'on, off or reset'),
  ).action(
    apiAction(async ({ client, out }, nodeId, action) => {
      if (action !== 'on' && action !== 'off' && action !== 'reset')
        throw new CliError('the action is on, off or reset');
      out.result(await client.metal.power({ nodeId: nodeId!, action }), renderAnswer);
    }),
  );
  withConnection(
    metal
      .command('boot')
      .description('Set the one-time boot device.')
      .argument('<nodeId>', 'the node id')
      .argument('<device>', 'pxe, disk or cd'),
  ).action(
    apiAction(async ({ client, out }, nodeId, device) => {
      if (device !== 'pxe' && device !== 'disk' && device !== 'cd')
        throw new CliError('the device is pxe, disk or cd');
      out.result(await client.metal.bootDevice({ nodeId: nodeId!, device }), renderAnswer);
    }),
  );
  withConnection(
    metal
      .command('media')
      .description('Insert an image URL into the virtual CD, or eject it.')
      .argument('<nodeId>', 'the node id')
      .argument('<action>', 'insert or eject')
      .option('--image <url>', 'the image URL (insert)'),
  ).action(
    apiAction<{ image?: string }>(async ({ client, out, options }, nodeId, action) => {
      if (action !== 'insert' && action !== 'eject') throw new CliError('the action is insert or eject');
      out.result(
        await client.metal.virtualMedia({
          nodeId: nodeId!,
          action,
          ...(options.image ? { imageUrl: options.image } : {}),
        }),
        renderAnswer,
      );
    }),
  );
  registerProvisioningCommands(metal);
  registerCatalogCommands(program);
  withConnection(
    metal
      .command('inventory')
      .description("Read the machine's system from its BMC.")
      .argument('<nodeId>', 'the node id'),
  ).action(
    apiAction(async ({ client, out }, nodeId) => {
      out.result(await client.metal.inventory({ nodeId: nodeId! }), renderAnswer);
    }),
  );
}
