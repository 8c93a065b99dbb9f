import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import type { Methods } from '../../api/registry.ts';
import type { MethodOutput } from '../../client/index.ts';
import {
  generateReleaseSigningKey,
  type ReleaseSignature,
  releaseFileEntry,
  releaseManifestSchema,
  signRelease,
} from '../../domain/release-manifest.ts';
import { currentProtocolVersion } from '../../domain/release-version.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';

type ReleaseView = MethodOutput<Methods, 'releases', 'get'>;

function renderRelease(r: ReleaseView): string {
  return [
    renderFields([
      ['id', r.id],
      ['version', r.version],
      ['channel', r.channel],
      ['protocol', r.protocolVersion],
      ['needs control plane', `≥ ${r.minControlPlaneVersion}`],
      ['expires', formatTime(r.expiresAt)],
      ['signed by', r.signerPins.join(', ')],
      ['manifest digest', r.manifestDigest],
    ]),
    'files:',
    ...r.manifest.files.map((f) => `  ${f.path}  ${f.size} B  sha256 ${f.sha256}`),
  ].join('\n');
}

const readJson = (file: string): unknown => JSON.parse(readFileSync(file, 'utf8'));

/**
 * `releases keygen|manifest|sign|publish|list|get`. keygen, manifest and sign run offline (no
 * control plane): an operator signs a manifest with a local key file, and publish sends the
 * manifest, its signatures and its files.
 */
export function registerReleaseCommands(program: Command) {
  const releases = program.command('releases').description('Signed bcd releases.');

  releases
    .command('keygen')
    .description(
      'Make an Ed25519 release signing key (offline); prints its pin for BETTER_COMPUTE_RELEASE_PINS.',
    )
    .addOption(required('--out <file>', 'where to write the private key (PKCS#8 PEM, mode 600)'))
    .option('--json', 'print the result as JSON, for scripts')
    .action((options: { out: string; json?: boolean }) => {
      const key = generateReleaseSigningKey();
      writeFileSync(options.out, key.privateKeyPem, { mode: 0o600 });
      const result = { keyFile: options.out, pin: key.pin, publicKeyPem: key.publicKeyPem };
      process.stdout.write(options.json ? `${JSON.stringify(result, null, 2)}\n` : `${key.pin}\n`);
    });

  releases
    .command('manifest')
    .description('Write the manifest of a bcd version’s files (offline): path, size and SHA-256 of each.')
    .argument('<dir>', 'the directory holding the release’s files')
    .addOption(required('--version <version>', 'the bcd version, e.g. 0.2.0'))
    .option('--channel <channel>', 'the release channel', 'stable')
    .option('--protocol <n>', 'its session protocol version', parse.positiveInt, currentProtocolVersion)
    .option('--min-control-plane <version>', 'the oldest control plane it may run against', '0.1.0')
    .option('--expires <when>', 'its expiry (ISO date-time, or +30d)', '+90d')
    .addOption(required('--out <file>', 'where to write the manifest (JSON)'))
    .option('--json', 'print the manifest as JSON')
    .action(
      (
        dir: string,
        options: {
          version: string;
          channel: string;
          protocol: number;
          minControlPlane: string;
          expires: string;
          out: string;
          json?: boolean;
        },
      ) => {
        const files = listFiles(dir).map((rel) => releaseFileEntry(rel, readFileSync(path.join(dir, rel))));
        const manifest = releaseManifestSchema.parse({
          channel: options.channel,
          version: options.version,
          protocolVersion: options.protocol,
          minControlPlaneVersion: options.minControlPlane,
          files,
          expiresAt: new Date(parse.instant(options.expires)).toISOString(),
        });
        writeFileSync(options.out, `${JSON.stringify(manifest, null, 2)}\n`);
        process.stdout.write(
          options.json
            ? `${JSON.stringify(manifest, null, 2)}\n`
            : `${options.out}: ${files.length} file(s)\n`,
        );
      },
    );

  releases
    .command('sign')
    .description('Sign a manifest with a local Ed25519 key file (offline); adds to the signatures file.')
    .argument('<manifest>', 'the manifest (JSON)')
    .addOption(required('--key <file>', 'the private key (PKCS#8 PEM)'))
    .addOption(required('--out <file>', 'the signatures file (JSON array; appended to when it exists)'))
    .option('--json', 'print the signature as JSON')
    .action((manifestFile: string, options: { key: string; out: string; json?: boolean }) => {
      const manifest = releaseManifestSchema.parse(readJson(manifestFile));
      const signature = signRelease(manifest, readFileSync(options.key, 'utf8'));
      let existing: ReleaseSignature[] = [];
      try {
        existing = readJson(options.out) as ReleaseSignature[];
      } catch {
        existing = [];
      }
      const all = [...existing.filter((s) => s.keyId !== signature.keyId), signature];
      writeFileSync(options.out, `${JSON.stringify(all, null, 2)}\n`);
      process.stdout.write(
        options.json
          ? `${JSON.stringify(signature, null, 2)}\n`
          : `signed by ${signature.keyId} (${all.length} signature(s) in ${options.out})\n`,
      );
    });

  withConnection(
    releases
      .command('publish')
      .description('Publish a signed release: the manifest, its signatures and the files it lists.')
      .argument('<manifest>', 'the manifest (JSON)')
      .addOption(required('--signatures <file>', 'the signatures file written by releases sign'))
      .addOption(required('--files <dir>', 'the directory holding the release’s files')),
  ).action(
    apiAction<{ signatures: string; files: string }>(async ({ options, client, out }, manifestFile) => {
      const manifest = releaseManifestSchema.parse(readJson(manifestFile!));
      const release = await client.releases.publish({
        manifest,
        signatures: readJson(options.signatures) as ReleaseSignature[],
        files: manifest.files.map((f) => ({
          path: f.path,
          content: readFileSync(path.join(options.files, f.path)).toString('base64'),
        })),
      });
      out.result(release, (r) => `${r.created ? 'published' : 'already published'}: ${r.id} (${r.version})`);
    }),
  );

  withConnection(
    releases
      .command('list')
      .description('Published releases, newest first.')
      .option('--channel <channel>', 'only this channel’s')
      .option('--limit <n>', 'at most this many', parse.positiveInt),
  ).action(
    apiAction<{ channel?: string; limit?: number }>(async ({ options, client, out }) => {
      const page = await client.releases.list({
        ...(options.channel ? { channel: options.channel } : {}),
        ...(options.limit ? { limit: options.limit } : {}),
      });
      out.result(page, (p) =>
        p.releases.length === 0
          ? 'no releases'
          : renderTable(p.releases, [
              { header: 'ID', value: (r) => r.id },
              { header: 'VERSION', value: (r) => r.version },
              { header: 'CHANNEL', value: (r) => r.channel },
              { header: 'PROTOCOL', value: (r) => r.protocolVersion, right: true },
              { header: 'EXPIRES', value: (r) => formatTime(r.expiresAt) },
              { header: 'SIGNERS', value: (r) => r.signerPins.length, right: true },
            ]),
      );
    }),
  );

  withConnection(releases.command('get').description('One release.').argument('<release-id>')).action(
    apiAction(async ({ client, out }, id) => {
      out.result(await client.releases.get({ releaseId: id! }), renderRelease);
    }),
  );
}

function listFiles(dir: string, prefix = ''): string[] {
  return readdirSync(path.join(dir, prefix))
    .sort()
    .flatMap((name) => {
      const rel = prefix ? `${prefix}/${name}` : name;
      return statSync(path.join(dir, rel)).isDirectory() ? listFiles(dir, rel) : [rel];
    });
}
