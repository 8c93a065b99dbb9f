import { z } from 'zod';
import { errorCodes, errorCodeTraits } from '../domain/errors.ts';
import { eventTypes } from '../domain/event-types.ts';
import { requiredHeader } from '../domain/http-protocol.ts';
import { eventSchema } from './events.ts';
import type { MethodRegistry } from './method.ts';
import { maxRequestBodyBytes } from './request-body.ts';
import { clientRequestIdPattern } from './request-id.ts';
import { maxInputDepth } from './validation.ts';

type JsonSchema = Record<string, unknown>;

export interface OpenApiOptions {
  title?: string;
  version?: string;
  /** Absolute URLs the API is served at; omitted, the document is relative to where it is read. */
  servers?: string[];
}

function pascal(...parts: string[]): string {
  return parts.map((p) => p.replace(/(^|[-_.\s]+)(\w)/g, (_, __, c: string) => c.toUpperCase())).join('');
}

const schemaRef = (name: string) => ({ $ref: `#/components/schemas/${name}` });

/**
 * What every string of a request may hold: anything but a NUL or a lone UTF-16 surrogate, which
 * the server refuses in any string before a schema sees it (api/validation.ts). JSON Schema reads
 * patterns with Unicode semantics, where a surrogate pair is one code point outside this range.
 */
const safeTextPattern = '^[^\\u0000\\uD800-\\uDFFF]*$';

/**
 * Whether a pattern can be trusted to refuse a NUL and a lone surrogate by itself: anchored at both
 * ends, with neither a wildcard nor a negated class. Every other one gets `safeTextPattern` beside it.
 */
function refusesUnsafeText(pattern: string): boolean {
  return pattern.startsWith('^') && pattern.endsWith('$') && !/(^|[^\\])\.|\[\^|\\[SWDuxc0]/.test(pattern);
}

const schemaKeywords = ['items', 'additionalProperties', 'propertyNames', 'not', 'contains'] as const;
const schemaListKeywords = ['anyOf', 'oneOf', 'allOf', 'prefixItems'] as const;
const schemaMapKeywords = ['properties', 'patternProperties', '$defs'] as const;

/** `node` with `visit` applied to it and to every schema inside it, innermost first. */
function mapSchemas(node: unknown, visit: (schema: JsonSchema) => JsonSchema): unknown {
  if (!node || typeof node !== 'object' || Array.isArray(node)) return node;
  const out: JsonSchema = { ...(node as JsonSchema) };
  for (const key of schemaKeywords) {
    if (out[key] && typeof out[key] === 'object') out[key] = mapSchemas(out[key], visit);
  }
  for (const key of schemaListKeywords) {
    if (Array.isArray(out[key])) out[key] = (out[key] as unknown[]).map((item) => mapSchemas(item, visit));
  }
  for (const key of schemaMapKeywords) {
    const map = out[key] as Record<string, unknown> | undefined;
    if (map && typeof map === 'object') {
      out[key] = Object.fromEntries(
        Object.entries(map).map(([name, item]) => [name, mapSchemas(item, visit)]),
      );
    }
  }
  return visit(out);
}

/**
 * What the server refuses before any schema, stated in a request's schema: a string holding a NUL
 * or a lone surrogate (`safeTextPattern` on every string that does not already refuse them), and
 * the same inside values a method takes as any JSON (`{}` becomes the `JsonValue` component).
 */
function stateRequestLimits(schema: JsonSchema): JsonSchema {
  const meaningful = Object.keys(schema).filter((k) => k !== 'description' && k !== 'default');
  if (meaningful.length === 0) return { ...schema, ...schemaRef('JsonValue') };
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  if (!types.includes('string') || 'enum' in schema || 'const' in schema) return schema;
  const pattern = schema.pattern as string | undefined;
  if (pattern === undefined) return { ...schema, pattern: safeTextPattern };
  if (refusesUnsafeText(pattern)) return schema;
  return { ...schema, allOf: [...((schema.allOf as unknown[]) ?? []), { pattern: safeTextPattern }] };
}

/** Rewrites every `#/$defs/X` reference inside `node` to `#/components/schemas/{prefix}X`. */
function rewriteRefs(node: unknown, prefix: string): unknown {
  if (Array.isArray(node)) return node.map((item) => rewriteRefs(item, prefix));
  if (!node || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(node)) {
    if (key === '$ref' && typeof value === 'string' && value.startsWith('#/$defs/')) {
      out[key] = `#/components/schemas/${prefix}${value.slice('#/$defs/'.length)}`;
    } else {
      out[key] = rewriteRefs(value, prefix);
    }
  }
  return out;
}

/**
 * One zod schema as a JSON Schema 2020-12 component (the dialect OpenAPI 3.1 uses). Its `$defs`
 * (recursive or shared parts) are hoisted into `components.schemas` under `{name}_`. An input
 * also states the limits every request has besides its schema (`stateRequestLimits`).
 */
function component(
  schema: z.ZodType,
  io: 'input' | 'output',
  name: string,
  into: Record<string, JsonSchema>,
) {
  const generated = z.toJSONSchema(schema, {
    target: 'draft-2020-12',
    io,
    unrepresentable: 'any',
    reused: 'inline',
    cycles: 'ref',
  }) as JsonSchema;
  const { $schema: _dialect, $defs, ...body } = generated;
  const prefix = `${name}_`;
  const finish = (node: unknown) =>
    rewriteRefs(io === 'input' ? mapSchemas(node, stateRequestLimits) : node, prefix) as JsonSchema;
  for (const [defName, def] of Object.entries(($defs as Record<string, JsonSchema> | undefined) ?? {})) {
    into[`${prefix}${defName}`] = finish(def);
  }
  into[name] = finish(body);
  return schemaRef(name);
}

const statusText: Record<number, string> = {
  400: `Bad input: the body is not JSON or not ${maxRequestBodyBytes} bytes at most (\`details.limitBytes\`), nests deeper than ${maxInputDepth} levels, holds a NUL or a lone surrogate, or fails the method's schema or its rules (\`details.issues\` names the fields)`,
  401: 'No valid credential',
  402: 'Spend limit reached',
  403: 'Refused by IAM, or waiting for a confirmation (`details.confirmationId`)',
  404: 'Not found (or not yours: the same answer)',
  409: 'Conflict or invalid state',
  422: 'Understood but not served by this server',
  429: 'Quota exceeded, or rate limited (`details.retryAfterSeconds` and `Retry-After`)',
  500: 'Internal error: the server logged the cause under the request id',
  503: 'No capacity now (CAPACITY_UNAVAILABLE), or the database or Temporal out of reach (UNAVAILABLE: retry after `Retry-After`)',
};

/** The response name of an error status in `components.responses`. */
const errorResponseName = (status: number) => `Error${status}`;

const errorStatuses = [...new Set(Object.values(errorCodeTraits).map((t) => t.httpStatus))].sort();

function codesFor(status: number): string[] {
  return errorCodes.filter((code) => errorCodeTraits[code].httpStatus === status);
}

/** The `{ error }` envelope whose code is one of `codes`. */
function envelopeWith(codes: readonly string[]): JsonSchema {
  return {
    allOf: [
      schemaRef('ErrorEnvelope'),
      {
        type: 'object',
        properties: { error: { type: 'object', properties: { code: { enum: [...codes] } } } },
      },
    ],
  };
}

const headers = {
  requestId: {
    description:
      'The request id: the client’s own `X-Request-Id` when well-formed, else one the server chose.',
    schema: { type: 'string' },
  },
  retryAfter: {
    description:
      'Whole seconds to wait before trying again, when the answer says so (`details.retryAfterSeconds`).',
    schema: { type: 'string', pattern: '^\\d+$' },
  },
  allow: { description: 'The HTTP methods the path answers.', required: true, schema: { type: 'string' } },
};

/** Every error answer: one response per HTTP status, whose envelope names that status' codes. */
function errorResponseComponents(): Record<string, unknown> {
  const responses: Record<string, unknown> = {};
  for (const status of errorStatuses) {
    responses[errorResponseName(status)] = {
      description: `${statusText[status] ?? 'Error'}: ${codesFor(status).join(', ')}.`,
      headers: { 'X-Request-Id': headers.requestId, 'Retry-After': headers.retryAfter },
      content: { 'application/json': { schema: envelopeWith(codesFor(status)) } },
    };
  }
  responses.MethodNotAllowed = {
    description:
      'Another HTTP method than the path’s (a method call is POST; the document and the event stream are GET or HEAD): 405 with `Allow`, and the envelope with code INVALID_INPUT and `details.allow`.',
    headers: { Allow: headers.allow, 'X-Request-Id': headers.requestId },
    content: { 'application/json': { schema: envelopeWith(['INVALID_INPUT']) } },
  };
  return responses;
}

const errorResponseRefs = () =>
  Object.fromEntries(
    errorStatuses.map((status) => [
      String(status),
      { $ref: `#/components/responses/${errorResponseName(status)}` },
    ]),
  );

/** The event as every door shows it, its type from the one closed list. */
const documentedEvent = eventSchema.extend({
  id: z.string().describe('`evt_…`'),
  seq: z.number().int().describe('Outbox position; the stream resumes after it.'),
  type: z.enum(eventTypes),
  subject: z.string().describe('What it is about, such as `reservation/rsv_…` or `node/node_…`.'),
  createdAt: z.number().int().describe('Epoch milliseconds.'),
});

/** The frames of `GET /api/compute/events/stream`, as `{ id, event, data }` with `data` parsed. */
function eventStreamFrameSchemas(): Record<string, JsonSchema> {
  const seqId = { type: 'string', pattern: '^\\d+$', description: 'The seq, also the next `Last-Event-ID`.' };
  return {
    EventStreamReady: {
      type: 'object',
      description:
        'The first frame: the position the stream starts from (resuming after it loses and repeats nothing).',
      required: ['id', 'event', 'data'],
      additionalProperties: false,
      properties: {
        id: seqId,
        event: { const: 'ready' },
        data: {
          type: 'object',
          required: ['seq'],
          additionalProperties: false,
          properties: { seq: { type: 'integer', minimum: 0 } },
        },
      },
    },
    EventStreamEvent: {
      type: 'object',
      description: 'One outbox event: `event` is its type, `data` the Event.',
      required: ['id', 'event', 'data'],
      additionalProperties: false,
      properties: { id: seqId, event: { type: 'string', enum: [...eventTypes] }, data: schemaRef('Event') },
    },
    EventStreamFrame: {
      description:
        'A frame of the event stream with its `data` parsed as JSON. Between frames, a comment line (`: keep-alive`) keeps idle connections open.',
      oneOf: [schemaRef('EventStreamReady'), schemaRef('EventStreamEvent')],
    },
  };
}

const jsonValueSchema: JsonSchema = {
  description: `Any JSON value whose strings and keys hold no NUL or lone surrogate (the whole body nests at most ${maxInputDepth} levels).`,
  anyOf: [
    { type: 'null' },
    { type: 'boolean' },
    { type: 'number' },
    { type: 'string', pattern: safeTextPattern },
    { type: 'array', items: schemaRef('JsonValue') },
    {
      type: 'object',
      propertyNames: { pattern: safeTextPattern },
      additionalProperties: schemaRef('JsonValue'),
    },
  ],
};

function eventStreamPath(errorResponses: Record<string, unknown>) {
  return {
    get: {
      operationId: 'events.stream',
      tags: ['events'],
      summary:
        'Server-sent events: every outbox event the credential may read, live. Reconnect with Last-Event-ID (the last seq seen) to resume without losing or repeating one.',
      security: [{ bearer: [] }],
      parameters: [
        {
          name: 'subject',
          in: 'query',
          required: false,
          description: 'Only events about this subject (empty: every subject).',
          schema: { type: 'string' },
        },
        {
          name: 'tenantId',
          in: 'query',
          required: false,
          description: 'Default: your own tenant; a platform administrator without it reads every tenant.',
          schema: { type: 'string' },
        },
        {
          name: 'after',
          in: 'query',
          required: false,
          description:
            'Like Last-Event-ID, for clients that cannot set headers. 0 starts at the oldest event still in the replay window; a position behind it is INVALID_INPUT.',
          schema: { type: 'string', pattern: '^\\d{1,18}$' },
        },
        {
          name: 'type',
          in: 'query',
          required: false,
          description: 'Only events of these types, or of a family (`reservation.*`); repeat it for several.',
          schema: { type: 'array', items: { type: 'string' } },
        },
        {
          name: 'Last-Event-ID',
          in: 'header',
          required: false,
          description:
            'Resume after this seq; without it the stream starts with the next event. A position behind the replay window is INVALID_INPUT.',
          schema: { type: 'string', pattern: '^\\d{1,18}$' },
        },
      ],
      responses: {
        '200': {
          description:
            'A `text/event-stream` of frames, each with `id` (the seq), `event` and `data` (JSON): first one `ready` frame, then one frame per event (`x-itemSchema`, as OpenAPI 3.2 `itemSchema` states it, gives each frame with its data parsed).',
          headers: { 'X-Request-Id': headers.requestId },
          content: {
            'text/event-stream': {
              schema: { type: 'string' },
              'x-itemSchema': schemaRef('EventStreamFrame'),
            },
          },
        },
        ...errorResponses,
      },
    },
  };
}

/**
 * The OpenAPI 3.1 document of every method in `registry`, generated from the same zod schemas
 * the server validates with: `POST /api/compute/{group}/{method}`, its input as the request body
 * (optional where the input accepts `{}`, which an absent body is read as), `{ data: output }` on
 * success and the `{ error }` envelope, per status with its closed set of codes, otherwise.
 */
export function buildOpenApiDocument(registry: MethodRegistry, options: OpenApiOptions = {}) {
  const schemas: Record<string, JsonSchema> = {
    ErrorEnvelope: {
      type: 'object',
      required: ['error'],
      additionalProperties: false,
      properties: {
        error: {
          type: 'object',
          required: ['code', 'message', 'requestId'],
          additionalProperties: false,
          properties: {
            code: { type: 'string', enum: [...errorCodes] },
            message: { type: 'string', description: 'What went wrong and what to do; never parse it.' },
            details: { type: 'object', additionalProperties: true },
            requestId: { type: 'string' },
          },
        },
      },
    },
    JsonValue: jsonValueSchema,
    ...eventStreamFrameSchemas(),
  };
  component(documentedEvent, 'output', 'Event', schemas);
  const errorResponses = errorResponseRefs();

  const paths: Record<string, unknown> = {};
  const tags: Array<{ name: string }> = [];
  for (const [group, methods] of Object.entries(registry)) {
    tags.push({ name: group });
    for (const [name, method] of Object.entries(methods)) {
      const base = pascal(group, name);
      const input = component(method.input, 'input', `${base}Input`, schemas);
      const output = component(method.output, 'output', `${base}Output`, schemas);
      const bodyOptional = method.input.safeParse({}).success;
      paths[`/api/compute/${group}/${name}`] = {
        post: {
          operationId: `${group}.${name}`,
          tags: [group],
          summary: method.summary,
          ...(method.action
            ? { description: `IAM action: \`${method.action}\`.`, 'x-iam-action': method.action }
            : {}),
          security: [{ bearer: [] }],
          parameters: [
            { $ref: '#/components/parameters/XBetterCompute' },
            { $ref: '#/components/parameters/XRequestId' },
          ],
          requestBody: {
            required: !bodyOptional,
            ...(bodyOptional ? { description: 'May be left out: an absent or empty body is `{}`.' } : {}),
            content: { 'application/json': { schema: input } },
          },
          responses: {
            '200': {
              description: 'The answer',
              headers: { 'X-Request-Id': headers.requestId },
              content: {
                'application/json': {
                  schema: {
                    type: 'object',
                    required: ['data'],
                    additionalProperties: false,
                    properties: { data: output },
                  },
                },
              },
            },
            ...errorResponses,
          },
        },
      };
    }
  }

  paths['/api/compute/events/stream'] = eventStreamPath(errorResponses);
  paths['/api/compute/openapi.json'] = {
    get: {
      operationId: 'openapi',
      summary: 'This document.',
      security: [],
      responses: {
        '200': {
          description: 'OpenAPI 3.1',
          content: { 'application/json': { schema: { type: 'object' } } },
        },
      },
    },
  };

  return {
    openapi: '3.1.0',
    info: {
      title: options.title ?? 'Better Compute API',
      version: options.version ?? '0.1.0',
      description: [
        'Every method is `POST /api/compute/{group}/{method}` with a JSON body, `Authorization: Bearer <token>` and `X-Better-Compute: 1`. It answers `{ data }` or `{ error: { code, message, details?, requestId } }`, with the HTTP status of its code.',
        `Every call: a body of at most ${maxRequestBodyBytes} bytes, JSON (\`Content-Type: application/json\`, or none), nesting at most ${maxInputDepth} levels, with no NUL or lone surrogate in any string or key; else INVALID_INPUT. Calls are rate limited per token and per tenant (RATE_LIMITED, 429, with \`Retry-After\`).`,
        'Another HTTP method on a path answers 405 with `Allow` (`components.responses.MethodNotAllowed`).',
      ].join('\n\n'),
    },
    ...(options.servers?.length ? { servers: options.servers.map((url) => ({ url })) } : {}),
    tags,
    paths,
    components: {
      schemas,
      responses: errorResponseComponents(),
      parameters: {
        XBetterCompute: {
          name: requiredHeader.name,
          in: 'header',
          required: true,
          description: `Must be \`${requiredHeader.value}\` on every call, so a form on another site cannot post to the API.`,
          schema: { type: 'string', const: requiredHeader.value },
        },
        XRequestId: {
          name: 'X-Request-Id',
          in: 'header',
          required: false,
          description:
            'Your id for this call, logged and written to audit rows; one that does not match the pattern is ignored (the answer’s `X-Request-Id` says which was used).',
          schema: { type: 'string', pattern: clientRequestIdPattern.source },
        },
      },
      securitySchemes: {
        bearer: { type: 'http', scheme: 'bearer', description: 'An API token (`tokens create`).' },
      },
    },
  };
}

export type OpenApiDocument = ReturnType<typeof buildOpenApiDocument>;
