import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { CliError } from '../errors.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';

/** `tokens create|list|revoke`, `policies list|apply FILE`, `confirmations list|approve|deny`. */
export function registerAccessCommands(program: Command) {
  const tokens = program.command('tokens').description('API tokens (administrators of the platform).');
  withConnection(
    tokens
      .command('create')
      .description('Mint a token for an identity; the secret is shown once.')
      .addOption(required('--identity <id>', 'the identity the token acts as'))
      .option('--name <name>', 'a label for the token')
      .option('--expires-in <duration>', 'lifetime, e.g. 30d (default: no expiry)', parse.duration),
  ).action(
    apiAction<{ identity: string; name?: string; expiresIn?: number }>(async ({ options, client, out }) => {
      const token = await client.admin.createToken({
        identityId: options.identity,
        ...(options.name ? { name: options.name } : {}),
        ...(options.expiresIn ? { expiresInSeconds: Math.round(options.expiresIn / 1000) } : {}),
      });
      out.result(token, (t) =>
        [
          renderFields([
            ['token id', t.id],
            ['identity', t.identityId],
            ['expires', formatTime(t.expiresAt) ?? 'never'],
          ]),
          '',
          t.token,
          '',
          'This secret is shown once. Use it with --token or BETTER_COMPUTE_TOKEN.',
        ].join('\n'),
      );
    }),
  );
  withConnection(
    tokens
      .command('list')
      .description('Tokens of an identity or a tenant (never their secrets).')
      .option('--identity <id>', 'only this identity’s')
      .option('--tenant <tenant>', 'only this tenant’s'),
  ).action(
    apiAction<{ identity?: string; tenant?: string }>(async ({ options, client, out }) => {
      const result = await client.admin.listTokens({
        ...(options.identity ? { identityId: options.identity } : {}),
        ...(options.tenant ? { tenantId: options.tenant } : {}),
      });
      out.result(result, (r) =>
        r.tokens.length === 0
          ? 'no tokens'
          : renderTable(r.tokens, [
              { header: 'ID', value: (t) => t.id },
              { header: 'IDENTITY', value: (t) => t.identityId },
              { header: 'NAME', value: (t) => t.name },
              { header: 'CREATED', value: (t) => formatTime(t.createdAt) },
              { header: 'LAST USED', value: (t) => formatTime(t.lastUsedAt) ?? 'never' },
              { header: 'EXPIRES', value: (t) => formatTime(t.expiresAt) ?? 'never' },
              { header: 'REVOKED', value: (t) => formatTime(t.revokedAt) },
            ]),
      );
    }),
  );
  withConnection(
    tokens
      .command('revoke')
      .description('Revoke a token (it stops working within 30 s).')
      .argument('<token-id>'),
  ).action(
    apiAction(async ({ client, out }, tokenId) => {
      const result = await client.admin.revokeToken({ tokenId: tokenId! });
      out.result(result, (r) => `revoked ${r.id} at ${formatTime(r.revokedAt)}`);
    }),
  );

  const policies = program.command('policies').description('IAM policies of a tenant (versioned).');
  withConnection(
    policies
      .command('list')
      .description('Every version of a tenant’s policies, newest first.')
      .addOption(required('--tenant <tenant>', 'the tenant')),
  ).action(
    apiAction<{ tenant: string }>(async ({ options, client, out }) => {
      const result = await client.admin.listPolicies({ tenantId: options.tenant });
      out.result(result, (r) =>
        r.policies.length === 0
          ? `tenant ${options.tenant} has no policies`
          : renderTable(r.policies, [
              { header: 'NAME', value: (p) => p.name },
              { header: 'VERSION', value: (p) => p.version, right: true },
              { header: 'STATEMENTS', value: (p) => p.document.statements.length, right: true },
              { header: 'CREATED', value: (p) => formatTime(p.createdAt) },
              { header: 'DESCRIPTION', value: (p) => p.document.description },
            ]),
      );
    }),
  );
  withConnection(
    policies
      .command('apply')
      .description('Apply a policy document (JSON) as the next version of its name.')
      .argument('<file>', 'a JSON file: { "description"?, "statements": [...] }')
      .addOption(required('--tenant <tenant>', 'the tenant'))
      .option('--name <name>', 'the policy’s name (default: the file name without .json)'),
  ).action(
    apiAction<{ tenant: string; name?: string }>(async ({ options, client, out }, file) => {
      let document: unknown;
      try {
        document = JSON.parse(readFileSync(file!, 'utf8'));
      } catch (error) {
        const reason =
          (error as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (error as Error).message;
        throw new CliError(`cannot read the policy ${file}: ${reason}`);
      }
      const name = options.name ?? path.basename(file!).replace(/\.json$/i, '');
      // The server checks the file against the policy schema and names the field that is wrong.
      type PolicyDocument = Parameters<typeof client.admin.applyPolicy>[0]['document'];
      const policy = await client.admin.applyPolicy({
        tenantId: options.tenant,
        name,
        document: document as PolicyDocument,
      });
      out.result(policy, (p) => `applied ${p.name} v${p.version} to tenant ${p.tenantId}`);
    }),
  );

  const confirmations = program
    .command('confirmations')
    .description('Actions your agents asked you to confirm.');
  withConnection(
    confirmations.command('list').description('Confirmations waiting for you, newest first.'),
  ).action(
    apiAction(async ({ client, out }) => {
      const result = await client.confirmations.list();
      out.result(result, (r) =>
        r.confirmations.length === 0
          ? 'no confirmations'
          : renderTable(r.confirmations, [
              { header: 'ID', value: (c) => c.id },
              { header: 'STATE', value: (c) => c.state },
              { header: 'ACTION', value: (c) => c.action },
              { header: 'RESOURCE', value: (c) => `${c.resource.type}/${c.resource.id}` },
              { header: 'AGENT', value: (c) => c.agentIdentityId },
              { header: 'EXPIRES', value: (c) => formatTime(c.expiresAt) },
            ]),
      );
    }),
  );
  for (const verb of ['approve', 'deny'] as const) {
    withConnection(
      confirmations
        .command(verb)
        .description(
          verb === 'approve'
            ? 'Approve; the agent then retries with the same idempotency key.'
            : 'Deny; the agent’s retry stays ACCESS_DENIED.',
        )
        .argument('<confirmation-id>'),
    ).action(
      apiAction(async ({ client, out }, id) => {
        const result = await client.confirmations[verb]({ confirmationId: id! });
        out.result(result, (r) => `${r.id} ${r.state}: ${r.action} on ${r.resourceId}`);
      }),
    );
  }
}
