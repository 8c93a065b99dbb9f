import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import type { Methods } from '../../api/registry.ts';
import type { MethodOutput } from '../../client/index.ts';
import { signImage } from '../../domain/metal-images.ts';
import { generateReleaseSigningKey } from '../../domain/release-manifest.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { CliError } from '../errors.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';

type Workflow = MethodOutput<Methods, 'workflows', 'get'>;
type Image = MethodOutput<Methods, 'images', 'get'>;
type Profile = MethodOutput<Methods, 'profiles', 'get'>;

/** A workflow and its steps, one line each, with attempts and errors. */
export function renderWorkflow(wf: Workflow): string {
  return [
    renderFields([
      ['workflow', `${wf.id} (${wf.kind})`],
      ['node', wf.nodeId],
      ['profile', wf.profileId ? `${wf.profileId} v${wf.profileVersion}` : null],
      ['state', `${wf.state}${wf.phase === 'cleanup' ? ' (cleanup)' : ''}`],
      ['reason', wf.reason],
      ['abort requested', wf.abortRequested],
      ['started', formatTime(wf.createdAt)],
      ['finished', formatTime(wf.finishedAt)],
    ]),
    renderTable(wf.steps, [
      { header: '#', value: (s) => String(s.idx) },
      { header: 'STEP', value: (s) => (s.phase === 'cleanup' ? `(cleanup) ${s.name}` : s.name) },
      { header: 'ON', value: (s) => s.target },
      { header: 'STATE', value: (s) => s.state },
      { header: 'ATTEMPTS', value: (s) => `${s.attempts.length}/${s.maxAttempts}` },
      { header: 'WAITS FOR', value: (s) => (s.awaitRejoin ? `${s.awaitRejoin} to join` : '') },
      { header: 'ERROR', value: (s) => s.error ?? '' },
    ]),
  ].join('\n');
}

function renderImage(i: Image): string {
  return renderFields([
    ['image', `${i.name}@${i.version} (${i.id})`],
    ['format', i.format],
    ['sha256', i.sha256],
    ['url', i.url],
    [
      'verified',
      i.verified ? `yes, signer ${i.signerPin}` : i.signed ? 'no (signer not pinned here)' : 'no (unsigned)',
    ],
    ['visibility', i.visibility],
  ]);
}

function renderProfile(p: Profile): string {
  return renderFields([
    ['profile', `${p.name} v${p.version} (${p.id})`],
    ['image', p.spec.imageId],
    ['acceptance', p.spec.acceptance.join(', ')],
    ['host config', p.spec.hostConfig.map((u) => u.name).join(', ') || null],
    ['attempts per step', String(p.spec.maxAttempts)],
    ['immutable', p.immutable ? `yes (used ${formatTime(p.usedAt)})` : 'no (not used yet)'],
  ]);
}

/** `metal deploy|inspect|abort|retry|maintenance` and `metal workflows list|get|watch`. */
export function registerProvisioningCommands(metal: Command) {
  withConnection(
    metal
      .command('deploy')
      .description('Deploy a profile to a ready machine (a workflow on Temporal); prints its steps.')
      .argument('<nodeId>', 'the machine')
      .addOption(required('--profile <profileId>', 'the profile'))
      .option('--profile-version <n>', 'the profile version (default: the latest)', parse.positiveInt)
      .option('--key <key>', 'idempotency key (default: one per call)'),
  ).action(
    apiAction<{ profile: string; profileVersion?: number; key?: string }>(
      async ({ client, out, options }, nodeId) => {
        const wf = await client.metal.deploy({
          nodeId: nodeId!,
          profileId: options.profile,
          ...(options.profileVersion ? { profileVersion: options.profileVersion } : {}),
          idempotencyKey: options.key ?? `cli-${Date.now()}`,
        });
        out.result(wf, renderWorkflow);
      },
    ),
  );
  withConnection(
    metal
      .command('inspect')
      .description(
        'Inspect an enrolled machine over its ramdisk (inventory, hardware key); it becomes ready.',
      )
      .argument('<nodeId>', 'the machine')
      .option('--key <key>', 'idempotency key (default: one per call)'),
  ).action(
    apiAction<{ key?: string }>(async ({ client, out, options }, nodeId) => {
      out.result(
        await client.metal.inspect({ nodeId: nodeId!, idempotencyKey: options.key ?? `cli-${Date.now()}` }),
        renderWorkflow,
      );
    }),
  );
  withConnection(
    metal
      .command('abort')
      .description('Abort a workflow at once (even while it waits for a rejoin); its cleanup steps run.')
      .argument('<workflowId>', 'the workflow')
      .addOption(required('--reason <text>', 'why (the node keeps it as its maintenance reason)')),
  ).action(
    apiAction<{ reason: string }>(async ({ client, out, options }, workflowId) => {
      out.result(
        await client.metal.abort({ workflowId: workflowId!, reason: options.reason }),
        renderWorkflow,
      );
    }),
  );
  withConnection(
    metal
      .command('retry')
      .description('Resume a failed workflow from its failed step.')
      .argument('<workflowId>'),
  ).action(
    apiAction(async ({ client, out }, workflowId) => {
      out.result(await client.metal.retry({ workflowId: workflowId! }), renderWorkflow);
    }),
  );
  const maintenance = metal.command('maintenance').description('Maintenance of a node (out of placement).');
  withConnection(
    maintenance.command('set').argument('<nodeId>').addOption(required('--reason <text>', 'why')),
  ).action(
    apiAction<{ reason: string }>(async ({ client, out, options }, nodeId) => {
      const r = await client.nodes.setMaintenance({ nodeId: nodeId!, reason: options.reason });
      out.result(r, (x) => `node ${x.node.id} in maintenance: ${x.node.maintenanceReason}`);
    }),
  );
  withConnection(maintenance.command('clear').argument('<nodeId>')).action(
    apiAction(async ({ client, out }, nodeId) => {
      const r = await client.nodes.clearMaintenance({ nodeId: nodeId! });
      out.result(r, (x) => `node ${x.node.id} out of maintenance (${x.node.provisionState})`);
    }),
  );
  const workflows = metal.command('workflows').description('Provisioning workflows and their steps.');
  withConnection(
    workflows
      .command('list')
      .option('--node <nodeId>', 'only this machine')
      .option('--state <state>', 'running, succeeded, failed or aborted'),
  ).action(
    apiAction<{ node?: string; state?: string }>(async ({ client, out, options }) => {
      const state = options.state as 'running' | 'succeeded' | 'failed' | 'aborted' | undefined;
      if (state && !['running', 'succeeded', 'failed', 'aborted'].includes(state))
        throw new CliError('the state is running, succeeded, failed or aborted');
      const r = await client.workflows.list({
        ...(options.node ? { nodeId: options.node } : {}),
        ...(state ? { state } : {}),
      });
      out.result(r, (x) =>
        x.workflows.length === 0
          ? 'no workflows'
          : renderTable(x.workflows, [
              { header: 'WORKFLOW', value: (w) => w.id },
              { header: 'KIND', value: (w) => w.kind },
              { header: 'NODE', value: (w) => w.nodeId },
              { header: 'STATE', value: (w) => w.state },
              {
                header: 'STEP',
                value: (w) => w.steps.find((s) => s.state === 'running' || s.state === 'failed')?.name ?? '',
              },
              { header: 'REASON', value: (w) => w.reason ?? '' },
            ]),
      );
    }),
  );
  withConnection(workflows.command('get').argument('<workflowId>')).action(
    apiAction(async ({ client, out }, workflowId) => {
      out.result(await client.workflows.get({ workflowId: workflowId! }), renderWorkflow);
    }),
  );
  withConnection(
    workflows
      .command('watch')
      .description('Print each step as it changes until the workflow is over (or waits for an operator).')
      .argument('<workflowId>')
      .option('--interval <duration>', 'how often to look', parse.duration, 1_000),
  ).action(
    apiAction<{ interval: number }>(async ({ client, out, options }, workflowId) => {
      let shown = '';
      for (;;) {
        const wf = await client.workflows.get({ workflowId: workflowId! });
        const now = wf.steps.map((s) => `${s.name}=${s.state}/${s.attempts.length}`).join(' ');
        if (now !== shown) {
          shown = now;
          if (options.json) process.stdout.write(`${JSON.stringify(wf)}\n`);
          else process.stdout.write(`${renderWorkflow(wf)}\n\n`);
        }
        if (wf.state !== 'running') break;
        await new Promise((r) => setTimeout(r, options.interval)); // wall time: a polling interval
      }
      void out;
    }),
  );
}

/** `images register|list|get|keygen|sign` and `profiles create|list|get`. */
export function registerCatalogCommands(program: Command) {
  const images = program
    .command('images')
    .description('Images for bare-metal deploys (signed, content-addressed).');
  withConnection(
    images
      .command('register')
      .description(
        'Register an image: name@version, format, its file (for the SHA-256) and the URL it is served from.',
      )
      .argument('<name@version>')
      .addOption(required('--image-url <url>', 'where deploys stream it from'))
      .option('--format <format>', 'raw, qcow2 or iso', 'raw')
      .option('--file <path>', 'the image file (its SHA-256 is computed)')
      .option('--sha256 <hex>', 'its SHA-256, instead of --file')
      .option('--sign-key <pem>', 'an Ed25519 private key (PKCS#8 PEM) to sign it with')
      .option('--tenant <tenantId>', 'the tenant (administrators)'),
  ).action(
    apiAction<{
      url: string;
      format: string;
      file?: string;
      sha256?: string;
      signKey?: string;
      tenant?: string;
    }>(async ({ client, out, options }, ref) => {
      const [name, version] = (ref ?? '').split('@');
      if (!name || !version) throw new CliError('name the image as name@version');
      if (!['raw', 'qcow2', 'iso'].includes(options.format))
        throw new CliError('the format is raw, qcow2 or iso');
      const format = options.format as 'raw' | 'qcow2' | 'iso';
      const sha256 =
        options.sha256 ??
        (options.file ? createHash('sha256').update(readFileSync(options.file)).digest('hex') : undefined);
      if (!sha256) throw new CliError('give --file or --sha256');
      const signature = options.signKey
        ? signImage({ name, version, format, sha256 }, readFileSync(options.signKey, 'utf8'))
        : undefined;
      const image = await client.images.register({
        name,
        version,
        format,
        sha256,
        url: options.url,
        ...(signature ? { signature } : {}),
        ...(options.tenant ? { tenantId: options.tenant } : {}),
      });
      out.result(image, renderImage);
    }),
  );
  withConnection(images.command('list')).action(
    apiAction(async ({ client, out }) => {
      out.result(await client.images.list({}), (r) =>
        r.images.length === 0
          ? 'no images'
          : renderTable(r.images, [
              { header: 'ID', value: (i) => i.id },
              { header: 'IMAGE', value: (i) => `${i.name}@${i.version}` },
              { header: 'FORMAT', value: (i) => i.format },
              { header: 'VERIFIED', value: (i) => (i.verified ? 'yes' : 'no') },
              { header: 'VISIBILITY', value: (i) => i.visibility },
            ]),
      );
    }),
  );
  withConnection(images.command('get').argument('<imageId>')).action(
    apiAction(async ({ client, out }, imageId) =>
      out.result(await client.images.get({ imageId: imageId! }), renderImage),
    ),
  );
  images
    .command('keygen')
    .description(
      'A new Ed25519 image signing key: prints the private key (PEM) and the pin to allow (BETTER_COMPUTE_IMAGE_SIGNER_PINS).',
    )
    .option('--json', 'as JSON')
    .action((options: { json?: boolean }) => {
      const key = generateReleaseSigningKey();
      if (options.json)
        process.stdout.write(`${JSON.stringify({ privateKeyPem: key.privateKeyPem, pin: key.pin })}\n`);
      else process.stdout.write(`${key.privateKeyPem}\npin: ${key.pin}\n`);
    });

  const profiles = program
    .command('profiles')
    .description('Deploy profiles (versioned, immutable once used).');
  withConnection(
    profiles
      .command('create')
      .description('Write a new version of a profile.')
      .argument('<name>')
      .addOption(required('--image <imageId>', 'the image'))
      .option('--user-data <path>', 'a cloud-init user-data file')
      .option(
        '--accept <checks>',
        'acceptance checks: inventory-reported, gpus-present, gpus-healthy (comma-separated)',
      )
      .option('--attempts <n>', 'attempts per step', parse.positiveInt, 3)
      .option('--step-timeout <duration>', 'timeout of each step', parse.duration)
      .option('--tenant <tenantId>', 'the tenant (administrators)'),
  ).action(
    apiAction<{
      image: string;
      userData?: string;
      accept?: string;
      attempts: number;
      stepTimeout?: number;
      tenant?: string;
    }>(async ({ client, out, options }, name) => {
      const acceptance = options.accept?.split(',').map((s) => s.trim()) as
        | Array<'inventory-reported' | 'gpus-present' | 'gpus-healthy'>
        | undefined;
      const profile = await client.profiles.create({
        name: name!,
        ...(options.tenant ? { tenantId: options.tenant } : {}),
        spec: {
          imageId: options.image,
          ...(options.userData ? { userData: readFileSync(options.userData, 'utf8') } : {}),
          ...(acceptance ? { acceptance } : {}),
          maxAttempts: options.attempts,
          ...(options.stepTimeout ? { stepTimeoutSeconds: Math.round(options.stepTimeout / 1000) } : {}),
        },
      });
      out.result(profile, renderProfile);
    }),
  );
  withConnection(profiles.command('list')).action(
    apiAction(async ({ client, out }) => {
      out.result(await client.profiles.list({}), (r) =>
        r.profiles.length === 0
          ? 'no profiles'
          : renderTable(r.profiles, [
              { header: 'ID', value: (p) => p.id },
              { header: 'NAME', value: (p) => p.name },
              { header: 'VERSION', value: (p) => String(p.version) },
              { header: 'IMAGE', value: (p) => p.spec.imageId },
              { header: 'IMMUTABLE', value: (p) => (p.immutable ? 'yes' : 'no') },
            ]),
      );
    }),
  );
  withConnection(
    profiles
      .command('get')
      .argument('<profileId>')
      .option('--profile-version <n>', 'a version', parse.positiveInt),
  ).action(
    apiAction<{ profileVersion?: number }>(async ({ client, out, options }, profileId) =>
      out.result(
        await client.profiles.get({
          profileId: profileId!,
          ...(options.profileVersion ? { version: options.profileVersion } : {}),
        }),
        renderProfile,
      ),
    ),
  );
}
