import { type Command, Option } from 'commander';
import { ulid } from 'ulid';
import type { ComputeClient } from '../../client/index.ts';
import { isTerminal } from '../../domain/reservation-states.ts';
import { apiAction, type CommandContext, parse, withConnection } from '../command.ts';
import { CliError, exitCodes } from '../errors.ts';
import { formatTime } from '../output.ts';
import { type RequestOptions, requestFromOptions, withRequestOptions } from '../reservation-request.ts';
import {
  queryPath,
  type Reservation,
  renderReservation,
  renderReservationTable,
} from '../reservation-view.ts';
import { resolvePool, tenantOf } from '../tenant.ts';
import { registerTraceCommand } from './trace.ts';

/** Prints one field of a result (`--query PATH`), or the whole of it. */
function printQuery(out: CommandContext<unknown>['out'], value: unknown, path: string) {
  const { found, value: picked } = queryPath(value, path);
  if (!found) throw new CliError(`--query: the answer has no field ${path}`);
  if (out.json || (picked !== null && typeof picked === 'object')) {
    process.stdout.write(`${JSON.stringify(picked, null, 2)}\n`);
  } else {
    process.stdout.write(`${picked === null ? 'null' : String(picked)}\n`);
  }
}

const tenantOption = '--tenant <tenant>';
const tenantHelp = 'the tenant (default: your token’s)';

/** A failed operation exits with the refusal class, after printing the reservation. */
function settle(ctx: CommandContext<unknown>, reservation: Reservation) {
  if (reservation.operation.state === 'failed') {
    const error = reservation.operation.error;
    process.stderr.write(
      `better-compute: reservation ${reservation.id} ${reservation.state}: ${error?.code ?? ''} ${error?.message ?? ''}\n`,
    );
    process.exitCode = exitCodes.refused;
  }
  void ctx;
}

async function pollUntil(
  client: ComputeClient,
  tenantId: string,
  reservation: Reservation,
  deadline: number,
  progress: (line: string) => void,
): Promise<Reservation> {
  let current = reservation;
  let delay = 250;
  while (current.operation.state === 'running' && Date.now() < deadline) {
    const why = current.conditions.map((c) => `${c.type}: ${c.message}`).join('; ');
    progress(`… ${current.id} is ${current.state}${why ? ` (${why})` : ''}; waiting`);
    await new Promise((r) => setTimeout(r, Math.min(delay, Math.max(0, deadline - Date.now()))));
    delay = Math.min(delay * 2, 2000);
    current = await client.reservations.get({ tenantId, reservationId: current.id });
  }
  return current;
}

/** `reserve`, `extend`, `renew`, `release`, `cancel`, `reservations get|list|watch`. */
export function registerReservationCommands(program: Command) {
  withConnection(
    withRequestOptions(
      program
        .command('reserve')
        .description(
          'Reserve devices of a pool. Sends a new idempotency key unless --key is given, and prints it so you can retry.',
        )
        .option(tenantOption, tenantHelp),
      true,
    )
      .option('--key <key>', 'the idempotency key (reuse it to retry the same request safely)')
      .addOption(
        new Option('--wait <duration>', 'how long to wait while it is queued')
          .argParser(parse.duration)
          .default(20_000, '20s'),
      )
      .option('--query <path>', 'print only this field of the reservation, e.g. id'),
  ).action(
    apiAction<RequestOptions & { key?: string; wait: number; query?: string }>(async (ctx) => {
      const { options, client, out } = ctx;
      const tenantId = await tenantOf(client, options);
      options.pool = await resolvePool(client, tenantId, options.pool);
      const key = options.key ?? `cli-${ulid().toLowerCase()}`;
      if (!options.key) out.progress(`idempotency key: ${key} (pass --key ${key} to retry this request)`);
      const deadline = Date.now() + options.wait;
      let reservation = await client.reservations.create({
        ...requestFromOptions(options, tenantId),
        idempotencyKey: key,
        wait: { timeoutMs: Math.min(options.wait, 30_000) },
      });
      reservation = await pollUntil(client, tenantId, reservation, deadline, out.progress);
      if (options.query) printQuery(out, reservation, options.query);
      else out.result(reservation, renderReservation);
      settle(ctx as CommandContext<unknown>, reservation);
    }),
  );

  withConnection(
    program
      .command('extend')
      .description('Move a reservation’s end later, all or nothing.')
      .argument('<reservation-id>')
      .option(tenantOption, tenantHelp)
      .option('--until <when>', "the new end: ISO date-time, epoch ms, or '+12h' from now", parse.instant)
      .option('--by <duration>', 'how much later, e.g. 4h', parse.duration)
      .option('--key <key>', 'the idempotency key (default: a new one, printed)'),
  ).action(
    apiAction<{ until?: number; by?: number; key?: string }>(async ({ options, client, out }, id) => {
      if ((options.until === undefined) === (options.by === undefined)) {
        throw new CliError('give exactly one of --until (e.g. +12h) or --by (e.g. 4h)');
      }
      const tenantId = await tenantOf(client, options);
      const key = options.key ?? `cli-${ulid().toLowerCase()}`;
      if (!options.key) out.progress(`idempotency key: ${key}`);
      const result = await client.reservations.extend({
        tenantId,
        reservationId: id!,
        ...(options.until !== undefined ? { until: options.until } : { by: options.by! }),
        idempotencyKey: key,
      });
      out.result(result, (r) =>
        r.extended
          ? `extended ${r.reservation.id} to ${formatTime(r.reservation.during?.end)}`
          : `not extended: ${r.reservation.id} ends ${formatTime(r.reservation.during?.end)}${
              r.availableUntil
                ? `; it can reach at most ${formatTime(r.availableUntil)} (another booking starts then)`
                : ''
            }`,
      );
    }),
  );

  for (const [verb, description] of [
    ['renew', 'Move a leased reservation’s lease deadline to now + its lease.'],
    ['release', 'End a reservation now (a pending one is cancelled; a terminal one is unchanged).'],
    ['cancel', 'Withdraw a reservation that has not started (pending or placed).'],
  ] as const) {
    withConnection(
      program
        .command(verb)
        .description(description)
        .argument('<reservation-id>')
        .option(tenantOption, tenantHelp),
    ).action(
      apiAction(async ({ options, client, out }, id) => {
        const tenantId = await tenantOf(client, options);
        // A release (or renew) done twice does what it does once: safe to retry after a lost answer.
        const reservation = await client.reservations[verb](
          { tenantId, reservationId: id! },
          { idempotent: verb !== 'cancel' },
        );
        out.result(reservation, (r) =>
          verb === 'renew'
            ? `renewed ${r.id}: the lease now expires ${formatTime(r.lease?.expiresAt)}`
            : `${r.id} is ${r.state}${r.during ? `, ending ${formatTime(r.during.end)}` : ''}`,
        );
      }),
    );
  }

  const reservations = program.command('reservations').description('Read and follow reservations.');
  registerTraceCommand(reservations);
  withConnection(
    reservations
      .command('get')
      .description('One reservation; --query PATH prints one field (e.g. binding, during.end).')
      .argument('<reservation-id>')
      .option(tenantOption, tenantHelp)
      .option('--query <path>', 'print only this field, e.g. binding or allocations[0].nodeId'),
  ).action(
    apiAction<{ query?: string }>(async ({ options, client, out }, id) => {
      const tenantId = await tenantOf(client, options);
      const reservation = await client.reservations.get({ tenantId, reservationId: id! });
      if (!options.query) return out.result(reservation, renderReservation);
      printQuery(out, reservation, options.query);
    }),
  );
  withConnection(
    reservations
      .command('list')
      .description('Your reservations (--all: the tenant’s), newest first.')
      .option(tenantOption, tenantHelp)
      .option('--state <state>', 'only in this state')
      .option('--pool <pool>', 'only of this pool')
      .option('--all', 'every reservation of the tenant, not only yours')
      .option('--limit <n>', 'at most this many (1 to 200, default 50)', parse.positiveInt)
      .option('--cursor <id>', 'continue after this reservation (printed as "more:")'),
  ).action(
    apiAction<{ state?: string; pool?: string; all?: boolean; limit?: number; cursor?: string }>(
      async ({ options, client, out }) => {
        const tenantId = await tenantOf(client, options);
        const page = await client.reservations.list({
          tenantId,
          ...(options.all ? { scope: 'all' as const } : {}),
          ...(options.state ? { state: options.state as never } : {}),
          ...(options.pool ? { poolId: await resolvePool(client, tenantId, options.pool) } : {}),
          ...(options.limit ? { limit: options.limit } : {}),
          ...(options.cursor ? { cursor: options.cursor } : {}),
        });
        out.result(page, (p) =>
          [
            p.reservations.length === 0 ? 'no reservations' : renderReservationTable(p.reservations),
            ...(p.nextCursor ? [`more: --cursor ${p.nextCursor}`] : []),
          ].join('\n'),
        );
      },
    ),
  );
  withConnection(
    reservations
      .command('watch')
      .description('Follow a reservation’s events live until it ends, or reaches --until STATE.')
      .argument('<reservation-id>')
      .option(tenantOption, tenantHelp)
      .option('--until <state>', 'stop once it is in this state (e.g. active), or ended')
      .option('--timeout <duration>', 'give up after this long (exit 6)', parse.duration),
  ).action(
    apiAction<{ until?: string; timeout?: number }>(async ({ options, client, out }, id) => {
      const tenantId = await tenantOf(client, options);
      const reservation = await client.reservations.get({ tenantId, reservationId: id! });
      const subject = `reservation/${reservation.id}`;
      const print = (line: Record<string, unknown>, human: string) =>
        process.stdout.write(`${out.json ? JSON.stringify(line) : human}\n`);
      print(
        { kind: 'state', reservationId: reservation.id, state: reservation.state },
        `${reservation.id} is ${reservation.state}`,
      );
      const done = (state: string) => isTerminal(state) || state === options.until;
      if (done(reservation.state)) return;
      const stop = new AbortController();
      process.once('SIGINT', () => stop.abort());
      // History first, then live from the last event seen: nothing is missed in between.
      let after = 0;
      for (let next: number | null = 0; next !== null; ) {
        const page = await client.events.list({ tenantId, subject, limit: 500, after: next });
        after = page.items.at(-1)?.seq ?? after;
        next = page.next;
      }
      // It may have moved on between the first read and the history: read it once more, so a
      // state reached before `after` is not waited for in vain (later ones come on the stream).
      const now = await client.reservations.get({ tenantId, reservationId: reservation.id });
      if (now.state !== reservation.state) {
        print({ kind: 'state', reservationId: now.id, state: now.state }, `${now.id} is ${now.state}`);
        if (done(now.state)) return;
      }
      let timedOut = false;
      const timer =
        options.timeout === undefined
          ? undefined
          : setTimeout(() => {
              timedOut = true;
              stop.abort();
            }, options.timeout);
      for await (const event of client.$stream({ subject, after, signal: stop.signal })) {
        const state =
          typeof event.data.state === 'string' ? event.data.state : event.type.replace(/^reservation\./, '');
        print(
          { kind: 'event', ...event },
          `${formatTime(event.createdAt)}  ${event.type}${state ? `  → ${state}` : ''}${
            event.data.reason ? ` (${String(event.data.reason)})` : ''
          }`,
        );
        if (done(state)) stop.abort();
      }
      clearTimeout(timer);
      if (timedOut) {
        throw new CliError(
          `${reservation.id} did not reach ${options.until ?? 'its end'} within the --timeout`,
          exitCodes.timeout,
        );
      }
    }),
  );
}
