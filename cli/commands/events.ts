import type { Command } from 'commander';
import type { ComputeEvent } from '../../client/index.ts';
import type { EventTypePattern } from '../../domain/event-types.ts';
import { apiAction, parse, required, withConnection } from '../command.ts';
import { formatTime, renderTable } from '../output.ts';

const collect = (value: string, previous: string[] = []) => [...previous, value];

function eventLine(e: ComputeEvent): string {
  const data = Object.keys(e.data).length ? ` ${JSON.stringify(e.data)}` : '';
  return `${formatTime(e.createdAt)}  #${e.seq}  ${e.type}  ${e.subject}${data}`;
}

/** `events list|watch`, `webhooks create|list|delete|deliveries`. */
export function registerEventCommands(program: Command) {
  const events = program.command('events').description('The event history and the live stream.');
  withConnection(
    events
      .command('list')
      .description('Event history, oldest first; --after SEQ pages on.')
      .option('--subject <subject>', 'only this subject, e.g. reservation/rsv_…')
      .option('--type <type>', 'only this type (repeatable; reservation.* matches a prefix)', collect)
      .option('--after <seq>', 'start after this seq', parse.nonNegativeNumber)
      .option('--limit <n>', 'at most this many (default 100)', parse.positiveInt)
      .option('--tenant <tenant>', 'the tenant (default: your own; administrators: every tenant)'),
  ).action(
    apiAction<{ subject?: string; type?: string[]; after?: number; limit?: number; tenant?: string }>(
      async ({ options, client, out }) => {
        const page = await client.events.list({
          ...(options.subject ? { subject: options.subject } : {}),
          ...(options.type ? { types: options.type } : {}),
          ...(options.after !== undefined ? { after: options.after } : {}),
          ...(options.limit ? { limit: options.limit } : {}),
          ...(options.tenant ? { tenantId: options.tenant } : {}),
        });
        out.result(page, (p) =>
          [
            p.items.length === 0
              ? 'no events'
              : renderTable(p.items, [
                  { header: 'SEQ', value: (e) => e.seq, right: true },
                  { header: 'TIME', value: (e) => formatTime(e.createdAt) },
                  { header: 'TYPE', value: (e) => e.type },
                  { header: 'SUBJECT', value: (e) => e.subject },
                ]),
            ...(p.next !== null ? [`more: --after ${p.next}`] : []),
          ].join('\n'),
        );
      },
    ),
  );
  withConnection(
    events
      .command('watch')
      .description('Follow events live (one JSON object per line with --json) until interrupted.')
      .option('--subject <subject>', 'only this subject')
      .option('--type <type>', 'only this type (repeatable)', collect)
      .option('--after <seq>', 'replay from just after this seq first', parse.nonNegativeNumber)
      .option('--tenant <tenant>', 'the tenant (default: your own)'),
  ).action(
    apiAction<{ subject?: string; type?: string[]; after?: number; tenant?: string }>(
      async ({ options, client, out }) => {
        const stop = new AbortController();
        process.once('SIGINT', () => stop.abort());
        for await (const event of client.$stream({
          ...(options.subject ? { subject: options.subject } : {}),
          ...(options.type ? { types: options.type } : {}),
          ...(options.after !== undefined ? { after: options.after } : {}),
          signal: stop.signal,
        })) {
          if (out.json) process.stdout.write(`${JSON.stringify(event)}\n`);
          else process.stdout.write(`${eventLine(event)}\n`);
        }
      },
    ),
  );

  const webhooks = program
    .command('webhooks')
    .description('Deliver a tenant’s events to HTTPS endpoints, signed.');
  withConnection(
    webhooks
      .command('create')
      .description('Subscribe an endpoint; the signing secret is shown once.')
      .addOption(required('--tenant <tenant>', 'the tenant'))
      .addOption(required('--endpoint <url>', 'where to POST events'))
      .option('--type <type>', 'only this event type (repeatable; reservation.* matches a prefix)', collect)
      .option('--description <text>', 'a note for people'),
  ).action(
    apiAction<{ tenant: string; endpoint: string; type?: EventTypePattern[]; description?: string }>(
      async ({ options, client, out }) => {
        const hook = await client.webhooks.create({
          tenantId: options.tenant,
          url: options.endpoint,
          ...(options.type ? { eventTypes: options.type } : {}),
          ...(options.description ? { description: options.description } : {}),
        });
        out.result(hook, (h) =>
          [
            `webhook ${h.id} → ${h.url}`,
            `secret: ${h.secret}`,
            'Verify each delivery’s webhook-signature with it (README, "Events and webhooks").',
          ].join('\n'),
        );
      },
    ),
  );
  withConnection(
    webhooks
      .command('list')
      .description('The tenant’s webhooks.')
      .addOption(required('--tenant <tenant>', 'the tenant')),
  ).action(
    apiAction<{ tenant: string }>(async ({ options, client, out }) => {
      const result = await client.webhooks.list({ tenantId: options.tenant });
      out.result(result, (r) =>
        r.items.length === 0
          ? `tenant ${options.tenant} has no webhooks`
          : renderTable(r.items, [
              { header: 'ID', value: (h) => h.id },
              { header: 'URL', value: (h) => h.url },
              { header: 'TYPES', value: (h) => (h.eventTypes.length ? h.eventTypes.join(',') : 'all') },
              { header: 'CREATED', value: (h) => formatTime(h.createdAt) },
            ]),
      );
    }),
  );
  withConnection(
    webhooks
      .command('delete')
      .description('Stop a webhook.')
      .argument('<webhook-id>')
      .addOption(required('--tenant <tenant>', 'the tenant')),
  ).action(
    apiAction<{ tenant: string }>(async ({ options, client, out }, id) => {
      const result = await client.webhooks.delete({ tenantId: options.tenant, webhookId: id! });
      out.result(result, (r) => `deleted ${r.id}`);
    }),
  );
  withConnection(
    webhooks
      .command('deliveries')
      .description('Every delivery attempt of a webhook, newest first.')
      .argument('<webhook-id>')
      .addOption(required('--tenant <tenant>', 'the tenant'))
      .option('--limit <n>', 'at most this many', parse.positiveInt),
  ).action(
    apiAction<{ tenant: string; limit?: number }>(async ({ options, client, out }, id) => {
      const result = await client.webhooks.deliveries({
        tenantId: options.tenant,
        webhookId: id!,
        ...(options.limit ? { limit: options.limit } : {}),
      });
      out.result(result, (r) =>
        r.items.length === 0
          ? 'no deliveries yet'
          : renderTable(r.items, [
              { header: 'TIME', value: (d) => formatTime(d.createdAt) },
              { header: 'EVENT', value: (d) => `#${d.eventSeq} ${d.eventType}` },
              { header: 'ATTEMPT', value: (d) => d.attempt, right: true },
              { header: 'OUTCOME', value: (d) => d.outcome },
              { header: 'STATUS', value: (d) => d.statusCode },
              { header: 'MS', value: (d) => d.durationMs, right: true },
              { header: 'ERROR', value: (d) => d.error },
            ]),
      );
    }),
  );
}
