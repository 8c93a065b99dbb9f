import type { Command } from 'commander';
import { apiAction, withConnection } from '../command.ts';
import { temporalUiUrl } from '../context.ts';
import { tenantOf } from '../tenant.ts';

/**
 * `reservations trace ID`: where to see the reservation's lifecycle workflow (its id is the
 * reservation id) in the Temporal Web UI.
 */
export function registerTraceCommand(reservations: Command) {
  withConnection(
    reservations
      .command('trace')
      .description('The Temporal Web UI link of the reservation’s lifecycle workflow.')
      .argument('<reservation-id>')
      .option('--tenant <tenant>', 'the tenant (default: your token’s)')
      .option('--temporal-ui <url>', 'the Web UI (default: BETTER_COMPUTE_TEMPORAL_UI or the dev stack’s)')
      .option('--namespace <namespace>', 'the Temporal namespace', 'default'),
  ).action(
    apiAction<{ temporalUi?: string; namespace: string }>(async ({ options, client, out }, id) => {
      const tenantId = await tenantOf(client, options);
      const reservation = await client.reservations.get({ tenantId, reservationId: id! });
      const ui = temporalUiUrl(options.temporalUi);
      const path = `/namespaces/${encodeURIComponent(options.namespace)}/workflows/${encodeURIComponent(reservation.id)}`;
      const result = {
        workflowId: reservation.id,
        namespace: options.namespace,
        url: ui ? `${ui.replace(/\/+$/, '')}${path}` : null,
      };
      out.result(result, (r) =>
        r.url
          ? r.url
          : `workflow ${r.workflowId} in namespace ${r.namespace}: open ${path} on your Temporal Web UI (pass --temporal-ui URL to print the whole link)`,
      );
    }),
  );
}
