import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import type { ComputeClient } from '../../client/index.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { CliError } from '../errors.ts';
import { formatTime, renderFields, renderTable } from '../output.ts';

/** A pool's id from its id or its (unique) name, among every pool (administrators). */
async function poolIdOf(client: ComputeClient, pool: string): Promise<string> {
  const { pools } = await client.admin.listPools({});
  const byId = pools.find((p) => p.id === pool);
  if (byId) return byId.id;
  const named = pools.filter((p) => p.name === pool);
  if (named.length === 1) return named[0]!.id;
  const known = pools.map((p) => `${p.name} (${p.id})`).join(', ') || 'none';
  throw new CliError(
    named.length === 0
      ? `no pool is named or has the id ${pool}; the pools: ${known}`
      : `several pools are named ${pool}; pass its id: ${known}`,
  );
}

/** The policy document from `--policy '<json>'` or `--file policy.json`. */
function readPolicy(options: { policy?: string; file?: string }): unknown {
  if ((options.policy === undefined) === (options.file === undefined)) {
    throw new CliError('give the policy as exactly one of --policy <json> or --file <path>');
  }
  const [text, where] =
    options.file !== undefined ? [readText(options.file), options.file] : [options.policy!, '--policy'];
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new CliError(`${where} is not JSON: ${(error as Error).message}`);
  }
}

function readText(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (error) {
    const reason =
      (error as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (error as Error).message;
    throw new CliError(`cannot read the policy ${file}: ${reason}`);
  }
}

/** `pools list|policy|set-policy|archive|withdraw-offer` (administrators of the platform). */
export function registerPoolCommands(program: Command) {
  const pools = program.command('pools').description('Pools: policies, archive, offers (administrators).');
  withConnection(pools.command('list').description('Every pool, with its policy version and offers.')).action(
    apiAction(async ({ client, out }) => {
      const result = await client.admin.listPools({});
      out.result(result, (r) =>
        r.pools.length === 0
          ? 'no pools'
          : renderTable(r.pools, [
              { header: 'ID', value: (p) => p.id },
              { header: 'NAME', value: (p) => p.name },
              { header: 'GPU', value: (p) => p.gpuModel },
              { header: 'OWNER', value: (p) => p.ownerTenantId },
              { header: 'POLICY', value: (p) => `v${p.policyVersion}`, right: true },
              { header: 'ARCHIVED', value: (p) => p.archived },
              { header: 'OFFERED TO', value: (p) => p.offeredTo.join(',') },
            ]),
      );
    }),
  );
  withConnection(
    pools
      .command('policy')
      .description("A pool's policy and every recorded change of it, newest first.")
      .argument('<pool>', 'the pool’s id or name'),
  ).action(
    apiAction(async ({ client, out }, pool) => {
      const result = await client.admin.poolPolicyHistory({ poolId: await poolIdOf(client, pool!) });
      out.result(result, (r) =>
        [
          `pool ${r.poolId}, policy v${r.policyVersion}:`,
          JSON.stringify(r.policy, null, 2),
          '',
          r.versions.length === 0
            ? 'never changed since the pool was created'
            : renderTable(r.versions, [
                { header: 'VERSION', value: (v) => v.version, right: true },
                { header: 'CHANGED', value: (v) => formatTime(v.changedAt) },
                { header: 'BY', value: (v) => v.changedBy },
                { header: 'POLICY', value: (v) => JSON.stringify(v.policy) },
              ]),
        ].join('\n'),
      );
    }),
  );
  withConnection(
    pools
      .command('set-policy')
      .description("Replace a pool's policy (the next version); decisions from now on use it.")
      .argument('<pool>', 'the pool’s id or name')
      .option('--policy <json>', 'the policy document, e.g. \'{"spot":{"noticeSeconds":300}}\'')
      .option('--file <path>', 'a JSON file holding the policy document')
      .option(
        '--expected-version <n>',
        'refuse (CONFLICT) unless the policy is at this version',
        parse.positiveInt,
      ),
  ).action(
    apiAction<{ policy?: string; file?: string; expectedVersion?: number }>(
      async ({ options, client, out }, pool) => {
        type Policy = Parameters<typeof client.admin.setPoolPolicy>[0]['policy'];
        const policy = readPolicy(options) as Policy;
        const result = await client.admin.setPoolPolicy({
          poolId: await poolIdOf(client, pool!),
          policy,
          ...(options.expectedVersion !== undefined ? { expectedVersion: options.expectedVersion } : {}),
        });
        out.result(result, (r) => `pool ${r.poolId}: policy v${r.policyVersion} in force`);
      },
    ),
  );
  withConnection(
    pools
      .command('archive')
      .description('Archive a pool: pending and placed reservations fail (PoolGone), active ones run on.')
      .argument('<pool>', 'the pool’s id or name')
      .option('--reason <text>', 'why, for the audit log'),
  ).action(
    apiAction<{ reason?: string }>(async ({ options, client, out }, pool) => {
      const result = await client.admin.archivePool({
        poolId: await poolIdOf(client, pool!),
        ...(options.reason ? { reason: options.reason } : {}),
      });
      out.result(result, (r) =>
        renderFields([
          ['pool', r.poolId],
          ['archived', `${formatTime(r.archivedAt)}${r.changed ? '' : ' (already)'}`],
          ['reservations ending', r.reservationsEnding],
        ]),
      );
    }),
  );
  withConnection(
    pools
      .command('withdraw-offer')
      .description("Withdraw a pool's offer to a tenant: its pending and placed reservations there fail.")
      .argument('<pool>', 'the pool’s id or name')
      .addOption(required('--tenant <tenant>', 'the tenant the pool is offered to'))
      .option('--reason <text>', 'why, for the audit log'),
  ).action(
    apiAction<{ tenant: string; reason?: string }>(async ({ options, client, out }, pool) => {
      const result = await client.admin.withdrawOffer({
        poolId: await poolIdOf(client, pool!),
        tenantId: options.tenant,
        ...(options.reason ? { reason: options.reason } : {}),
      });
      out.result(
        result,
        (r) =>
          `withdrew pool ${r.poolId} from tenant ${r.tenantId}; ${r.reservationsEnding} pending or placed reservations end`,
      );
    }),
  );
}
