import { type Command, InvalidArgumentError } from 'commander';
import { apiAction, withConnection } from '../command.ts';

type GpuLayout = { uuid: string; profiles: string[] };

/** `--gpu GPU-…=1g.10gb,1g.10gb,3g.40gb` (repeatable; `GPU-…=` asks for MIG mode with no instances). */
function collectGpu(value: string, previous: GpuLayout[] = []): GpuLayout[] {
  const at = value.indexOf('=');
  if (at <= 0) {
    throw new InvalidArgumentError(
      `expected <gpu uuid>=<profile>,<profile>… such as GPU-5d5b…=1g.10gb,3g.40gb, got '${value}'`,
    );
  }
  const uuid = value.slice(0, at).trim();
  const profiles = value
    .slice(at + 1)
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
  return [...previous.filter((g) => g.uuid !== uuid), { uuid, profiles }];
}

/** `nodes set-mig-layout <node-id> --gpu <uuid>=<profiles>…` under the `nodes` command. */
export function registerNodeMigCommand(nodes: Command): void {
  withConnection(
    nodes
      .command('set-mig-layout')
      .description(
        'Set the MIG instances of GPUs of a node in a mig pool; bcd applies them and they become bookable once it reports the new spec generation. Refused while reservations book a GPU it changes (they are named).',
      )
      .argument('<node-id>')
      .requiredOption(
        '--gpu <uuid=profiles>',
        'a GPU and its instances, e.g. GPU-…=1g.10gb,1g.10gb,3g.40gb (repeat per GPU; `nodes get` lists the GPUs)',
        collectGpu,
      ),
  ).action(
    apiAction<{ gpu: GpuLayout[] }>(async ({ options, client, out }, id) => {
      const result = await client.nodes.setMigLayout({ nodeId: id!, gpus: options.gpu });
      out.result(
        result,
        (r) =>
          `${r.nodeId}: ${r.changed ? `MIG layout set in spec generation ${r.specGeneration}; its instances become bookable once the node reports it` : `already that layout (spec generation ${r.specGeneration})`}`,
      );
    }),
  );
}
