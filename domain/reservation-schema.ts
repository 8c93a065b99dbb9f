import { z } from 'zod';
import { boundedRecord } from './bounded-record.ts';
import { durationPatternWithin, formatDuration } from './duration.ts';
import { visibleReservationStates } from './reservation-states.ts';

/**
 * The reservations API's input schemas: the single source of the server types, the typed client,
 * the CLI's validation and the OpenAPI document. Bounds are part of the contract: anything outside
 * them is INVALID_INPUT naming the field.
 */

export const tenantIdSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,62}$/, "a tenant id: lower-case letters, digits, '-' or '_'");

/** The last epoch millisecond of the year 9999: the latest time any field may name. */
export const maxEpochMs = 253_402_300_799_999;

export const minDurationMs = 60_000;
export const maxDurationMs = 90 * 86_400_000;

/**
 * A duration from `minMs` to `maxMs`, as whole milliseconds or a string such as `'8h'`, `'90m'`,
 * `'1.5h'` or `'28800000ms'` (what `parseDuration` reads). The bounds are in the schema itself (a
 * minimum and maximum, and a pattern that matches only strings within them), so the OpenAPI
 * document states exactly what is accepted.
 */
export function durationWithin(minMs: number, maxMs: number) {
  const range = `from ${formatDuration(minMs)} to ${formatDuration(maxMs)}`;
  return z.union([
    z
      .number()
      .int('a whole number of milliseconds')
      .min(minMs, `at least ${minMs} ms (${formatDuration(minMs)})`)
      .max(maxMs, `at most ${maxMs} ms (${formatDuration(maxMs)})`),
    z
      .string()
      .max(100, { abort: true })
      .regex(
        new RegExp(durationPatternWithin(minMs, maxMs)),
        `a duration ${range} such as '8h', '90m', '2d', or whole milliseconds`,
      ),
  ]);
}

/** A reservation's length: 1 minute to 90 days. */
export const durationInputSchema = durationWithin(minDurationMs, maxDurationMs);

/** How much later an extend moves the end: at most 90 days (a reservation lasts at most 90 days in all). */
export const extendByInputSchema = durationWithin(1, maxDurationMs);

const attributeValue = z.union([z.string().max(200), z.number(), z.boolean()]);

export const deviceRequestSchema = z.strictObject({
  class: z.enum(['gpu', 'gpu.mig', 'gpu.slot']),
  count: z.number().int().min(1).max(64),
  /** `nvlink-all`: every device on one node in one NVLink domain; `any`: on one node. */
  topology: z.enum(['any', 'nvlink-all']).optional(),
  selector: z
    .strictObject({
      attributes: boundedRecord(z.string().min(1).max(100), attributeValue, 32).optional(),
      nodeLabels: boundedRecord(z.string().min(1).max(200), z.string().max(200), 32).optional(),
    })
    .optional(),
});

export const hostResourcesSchema = z.strictObject({
  vcpu: z.number().min(0).max(4096).optional(),
  memoryGiB: z.number().min(0).max(65_536).optional(),
  hugepages1Gi: z.number().int().min(0).max(65_536).optional(),
});

export const idempotencyKeySchema = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[\x21-\x7e]+$/, 'printable ASCII without spaces');

/** What a reservation asks for; shared by `reservations.create` and `capacity.preview`. */
export const reservationRequestShape = {
  tenantId: tenantIdSchema,
  poolId: z.string().min(1).max(100),
  devices: z.array(deviceRequestSchema).min(1).max(1, 'one device request per reservation (v0.1)'),
  duration: durationInputSchema,
  /**
   * Epoch milliseconds; a start in the future books the window now (a calendar reservation).
   * Admission also bounds it by its clock: at most 365 days ahead, at most 5 minutes past.
   */
  start: z.number().int().positive().max(maxEpochMs, 'epoch milliseconds before the year 10000').optional(),
  binding: z.enum(['hold', 'kubernetes', 'node', 'instance']).optional(),
  resources: hostResourcesSchema.optional(),
  leaseSeconds: z.number().int().min(60).max(86_400).optional(),
  projectId: z.string().min(1).max(100).optional(),
  spot: z.boolean().optional(),
  /**
   * A gang: `size` distinct nodes, each with the `devices` request, placed all or nothing over one
   * window; with `topologyKey` (a node label such as `fabric.domain`) all on one value of it.
   */
  gang: z
    .strictObject({
      size: z.number().int().min(2).max(64),
      topologyKey: z
        .string()
        .min(1)
        .max(200)
        .regex(/^[A-Za-z0-9][A-Za-z0-9._/-]*$/, "a node label key such as 'fabric.domain'")
        .optional(),
    })
    .optional(),
  node: z
    .strictObject({ profileId: z.string().min(1), profileVersion: z.number().int().positive().optional() })
    .optional(),
};

/**
 * `node` (what to deploy on the reserved machine) only with `binding: 'node'`: refused by the
 * schema, and stated in its JSON Schema (`dependentSchemas`), so the OpenAPI document says so too.
 */
function nodeOnlyWithNodeBinding<
  T extends z.ZodType<{ node?: unknown; binding?: string | undefined; spot?: boolean | undefined }>,
>(schema: T): T {
  return (
    schema
      .refine((v) => v.node === undefined || v.binding === 'node', {
        message: "only a binding: 'node' reservation takes node",
        path: ['node'],
      })
      .refine((v) => v.binding !== 'node' || v.node !== undefined, {
        message:
          "a binding: 'node' lease names the profile to deploy on its machines: node: { profileId, profileVersion? }",
        path: ['node'],
      })
      // Spot is preempted at a notice; a whole machine with root on it cannot be taken back so.
      .refine((v) => !(v.spot === true && v.binding === 'node'), {
        message: "a binding: 'node' lease cannot be spot; leave spot out or book a hold",
        path: ['spot'],
      })
      .meta({
        dependentSchemas: { node: { required: ['binding'], properties: { binding: { const: 'node' } } } },
        allOf: [
          {
            if: { properties: { binding: { const: 'node' } }, required: ['binding'] },
            // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then, not a promise
            then: { required: ['node'] },
          },
          {
            if: { properties: { spot: { const: true } }, required: ['spot'] },
            // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then, not a promise
            then: { properties: { binding: { not: { const: 'node' } } } },
          },
        ],
      })
  );
}

export const createReservationInput = nodeOnlyWithNodeBinding(
  z.strictObject({
    ...reservationRequestShape,
    idempotencyKey: idempotencyKeySchema,
    wait: z.strictObject({ timeoutMs: z.number().int().min(0).max(600_000) }).optional(),
  }),
);
export type CreateReservationInput = z.infer<typeof createReservationInput>;

export const previewInput = nodeOnlyWithNodeBinding(z.strictObject(reservationRequestShape));
export type PreviewInput = z.infer<typeof previewInput>;

export const reservationRefInput = z.strictObject({
  tenantId: tenantIdSchema,
  reservationId: z.string().min(1).max(100),
});

export const listReservationsInput = z.strictObject({
  tenantId: tenantIdSchema,
  scope: z.enum(['mine', 'all']).optional(),
  state: z
    .union([z.enum(visibleReservationStates), z.array(z.enum(visibleReservationStates)).min(1).max(12)])
    .optional(),
  poolId: z.string().min(1).max(100).optional(),
  limit: z.number().int().min(1).max(200).optional(),
  cursor: z.string().min(1).max(100).optional(),
});

export const extendInput = z
  .strictObject({
    tenantId: tenantIdSchema,
    reservationId: z.string().min(1).max(100),
    until: z.number().int().positive().optional(),
    by: extendByInputSchema.optional(),
    idempotencyKey: idempotencyKeySchema,
  })
  .refine((v) => (v.until === undefined) !== (v.by === undefined), {
    message: 'give exactly one of until (epoch milliseconds) or by (a duration)',
    path: ['until'],
  })
  // The same rule in the JSON Schema: exactly one of the two is present.
  .meta({ oneOf: [{ required: ['until'] }, { required: ['by'] }] });
