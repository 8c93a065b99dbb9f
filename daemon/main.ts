import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { createLogger } from '../core/logger.ts';
import { agentVersion, NodeAgent } from './agent.ts';
import { nodeCgroups } from './cgroups-node.ts';
import { parseDaemonConfig } from './config.ts';
import { defaultSimShape } from './hardware.ts';
import { identityExists, joinWithToken, loadIdentity } from './identity.ts';
import { NvidiaSmiHardware } from './nvidia-smi.ts';
import { startSimulatedFleet } from './sim.ts';
import { startSiteAgent } from './site-agent.ts';
import { formatDaemonStatus, readDaemonStatus } from './status.ts';

/** `bcd`: the node agent. join, node, status and sim. */
const program = new Command('bcd').description('The Better Compute node agent.').version(agentVersion);

const common = (cmd: Command) =>
  cmd
    .option('--dir <dir>', 'state directory (key, certificate, journal); env BCD_DIR')
    .option(
      '--root <dir>',
      'prefix for the CDI and env directories (etc/cdi, run/bcd/allocations); env BCD_ROOT',
    )
    .option('--cdi-dir <dir>', 'where CDI specs go; env BCD_CDI_DIR')
    .option('--env-dir <dir>', 'where allocation env files go; env BCD_ENV_DIR')
    .option('--log-level <level>', 'log level; env BCD_LOG_LEVEL');

function waitForSignal(stop: () => Promise<void>): void {
  const handler = () => {
    void stop().then(() => process.exit(0));
  };
  process.once('SIGINT', handler);
  process.once('SIGTERM', handler);
}

common(program.command('join'))
  .description('Join the control plane with a join token; writes the node key and certificate.')
  .requiredOption('--token <token>', 'the join token (bcjt_<id>.<secret>)')
  .requiredOption('--gateway <host:port>', 'the gateway address')
  .requiredOption('--ca-file <file>', "the control plane's CA certificate (PEM)")
  .option('--name <name>', 'the node name to ask for (default: the hostname)')
  .action(async (flags) => {
    const config = parseDaemonConfig(flags);
    const hardware = new NvidiaSmiHardware();
    await hardware.refresh().catch(() => {});
    const evidence = hardware.evidence();
    const identity = await joinWithToken({
      gateway: flags.gateway,
      token: flags.token,
      caCertificatePem: readFileSync(flags.caFile, 'utf8'),
      dir: config.dir,
      evidence,
      requestedName: flags.name ?? evidence.hostname,
      agentVersion,
    });
    console.log(
      `joined as ${identity.nodeName} (${identity.nodeId})${identity.reclaimed ? ', reclaimed' : ''}`,
    );
  });

common(program.command('node'))
  .description('Run the node agent: session, inventory, CDI holds, commands.')
  .option('--gateway <host:port>', 'override the gateway recorded at join')
  .option(
    '--kubelet-dir <dir>',
    "the kubelet's device-plugin directory (/var/lib/kubelet/device-plugins): serve kubernetes bindings as a device plugin; env BCD_KUBELET_DIR",
  )
  .action(async (flags) => {
    const config = parseDaemonConfig(flags);
    const log = createLogger({ level: config.logLevel, name: 'bcd' });
    if (!identityExists(config.dir)) throw new Error(`no identity in ${config.dir}: run bcd join first`);
    const identity = loadIdentity(config.dir);
    if (config.gateway) identity.gateway = config.gateway;
    const hardware = new NvidiaSmiHardware();
    await hardware.refresh();
    const agent = new NodeAgent({
      identity,
      stateDir: config.dir,
      roots: { cdiDir: config.cdiDir, envDir: config.envDir },
      hardware,
      cgroups: nodeCgroups(log),
      log: log.child({ nodeId: identity.nodeId }),
      ...(config.kubeletDir ? { kubelet: { deviceDir: config.kubeletDir } } : {}),
    });
    agent.start();
    log.info({ nodeId: identity.nodeId, gateway: identity.gateway }, 'bcd node running');
    waitForSignal(() => agent.stop());
  });

common(program.command('site'))
  .description(
    "Run the site agent: joins its site once with a site token (role site), then serves the site's boot lease and its machines' BMCs over Redfish when it holds the lease (a standby otherwise).",
  )
  .requiredOption('--gateway <host:port>', 'the gateway address')
  .requiredOption('--ca-file <file>', "the control plane's CA certificate (PEM)")
  .option('--token <token>', 'a site join token (bcst_…), needed only for the first start')
  .option('--name <name>', 'the agent name to ask for (default: the hostname)')
  .option(
    '--bmc-concurrency <n>',
    "BMC commands run at once for different machines (each machine's in order; default 16); env BCD_BMC_CONCURRENCY",
  )
  .action(async (flags) => {
    const config = parseDaemonConfig(flags);
    const log = createLogger({ level: config.logLevel, name: 'bcd-site' });
    const hardware = new NvidiaSmiHardware();
    await hardware.refresh().catch(() => {});
    const site = await startSiteAgent({
      gatewayAddress: flags.gateway,
      caCertificatePem: readFileSync(flags.caFile, 'utf8'),
      ...(flags.token ? { token: flags.token } : {}),
      dir: config.dir,
      name: flags.name ?? hardware.evidence().hostname,
      hardware,
      log,
      bmcConcurrency: config.bmcConcurrency,
    });
    console.log(
      `site agent ${site.identity.nodeName} (${site.identity.nodeId}) of site ${site.identity.siteId}`,
    );
    waitForSignal(() => site.stop());
  });

common(program.command('status'))
  .description('What this node holds, its session and its certificate expiry.')
  .option('--json', 'print JSON')
  .action((flags) => {
    const config = parseDaemonConfig(flags);
    const status = readDaemonStatus(config);
    console.log(flags.json ? JSON.stringify(status, null, 2) : formatDaemonStatus(status));
  });

program
  .command('sim')
  .description('Run N real node agents on fake hardware in one process.')
  .requiredOption('--nodes <n>', 'how many nodes', (v) => Number.parseInt(v, 10))
  .requiredOption('--gateway <host:port>', 'the gateway address')
  .requiredOption('--ca-file <file>', "the control plane's CA certificate (PEM)")
  .option('--token <token>', 'a join token allowing N uses (nodes already joined in --dir need none)', '')
  .option('--dir <dir>', 'root of the simulated nodes (one directory each)', '.data/sim')
  .option('--gpus <n>', 'GPUs per node', (v) => Number.parseInt(v, 10), defaultSimShape.gpus)
  .option(
    '--nvlink-domain <n>',
    'GPUs per NVLink domain',
    (v) => Number.parseInt(v, 10),
    defaultSimShape.nvlinkDomainSize,
  )
  .option('--gpu-model <model>', 'GPU model', defaultSimShape.gpuModel)
  .option('--join-concurrency <n>', 'joins in flight at once', (v) => Number.parseInt(v, 10), 4)
  .option(
    '--kubelet <mode>',
    "serve kubernetes bindings as a device plugin in <node dir>/device-plugins: 'stand-in' (an in-process kubelet per node) or 'external'",
  )
  .option('--log-level <level>', 'log level', 'info')
  .action(async (flags) => {
    if (flags.kubelet !== undefined && flags.kubelet !== 'stand-in' && flags.kubelet !== 'external') {
      throw new Error(
        `--kubelet must be 'stand-in' or 'external', not ${String(flags.kubelet).slice(0, 40)}`,
      );
    }
    const log = createLogger({ level: flags.logLevel, name: 'bcd-sim' });
    const fleet = await startSimulatedFleet({
      gatewayAddress: flags.gateway,
      caCertificatePem: readFileSync(flags.caFile, 'utf8'),
      joinToken: flags.token,
      nodes: flags.nodes,
      rootDir: path.resolve(flags.dir),
      log,
      shape: { gpus: flags.gpus, nvlinkDomainSize: flags.nvlinkDomain, gpuModel: flags.gpuModel },
      joinConcurrency: flags.joinConcurrency,
      ...(flags.kubelet ? { kubelet: flags.kubelet } : {}),
    });
    for (const node of fleet.nodes) console.log(`${node.name} ${node.nodeId}`);
    waitForSignal(() => fleet.stop());
  });

program.parseAsync(process.argv).catch((error: unknown) => {
  console.error(`bcd: ${(error as Error).message}`);
  process.exit(1);
});
