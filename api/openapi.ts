import { z } from 'zod';
import { errorCodes, errorCodeTraits } from '../domain/errors.ts';
import { eventTypes } from '../domain/event-types.ts';
import type { MethodRegistry } from './method.ts';

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
 * (recursive or shared parts) are hoisted into `components.schemas` under `{name}_`.
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
  for (const [defName, def] of Object.entries(($defs as Record<string, JsonSchema> | undefined) ?? {})) {
    into[`${prefix}${defName}`] = rewriteRefs(def, prefix) as JsonSchema;
  }
  into[name] = rewriteRefs(body, prefix) as JsonSchema;
  return { $ref: `#/components/schemas/${name}` };
}

const errorStatuses = [...new Set(Object.values(errorCodeTraits).map((t) => t.httpStatus))].sort();

function codesFor(status: number): string[] {
  return errorCodes.filter((code) => errorCodeTraits[code].httpStatus === status);
}

const statusText: Record<number, string> = {
  400: 'Bad input',
  401: 'No valid credential',
  402: 'Spend limit reached',
  403: 'Refused',
  404: 'Not found',
  409: 'Conflict or invalid state',
  422: 'Unsupported by this server',
  429: 'Quota exceeded or rate limited',
  500: 'Internal error',
  503: 'Capacity unavailable',
};

/**
 * The OpenAPI 3.1 document of every method in `registry`, generated from the same zod schemas
 * the server validates with: `POST /api/compute/{group}/{method}`, its input as the request body,
 * `{ data: output }` on success and the `{ error }` envelope (one closed set of codes) otherwise.
 */
export function buildOpenApiDocument(registry: MethodRegistry, options: OpenApiOptions = {}) {
  const schemas: Record<string, JsonSchema> = {
    ErrorEnvelope: {
      type: 'object',
      required: ['error'],
      properties: {
        error: {
          type: 'object',
          required: ['code', 'message', 'requestId'],
          properties: {
            code: { type: 'string', enum: [...errorCodes] },
            message: { type: 'string', description: 'What went wrong and what to do; never parse it.' },
            details: { type: 'object', additionalProperties: true },
            requestId: { type: 'string' },
          },
        },
      },
    },
    Event: {
      type: 'object',
      required: ['id', 'seq', 'type', 'subject', 'tenantId', 'data', 'createdAt'],
      properties: {
        id: { type: 'string', description: '`evt_…`' },
        seq: { type: 'integer', description: 'Outbox position; the stream resumes after it.' },
        type: { type: 'string', enum: [...eventTypes] },
        subject: { type: 'string', examples: ['reservation/rsv_…'] },
        tenantId: { type: ['string', 'null'] },
        data: { type: 'object', additionalProperties: true },
        createdAt: { type: 'integer', description: 'Epoch milliseconds.' },
      },
    },
  };
  const errorResponses: Record<string, unknown> = {};
  for (const status of errorStatuses) {
    errorResponses[String(status)] = {
      description: `${statusText[status] ?? 'Error'}: ${codesFor(status).join(', ')}`,
      content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
    };
  }

  const paths: Record<string, unknown> = {};
  const tags: Array<{ name: string }> = [];
  for (const [group, methods] of Object.entries(registry)) {
    tags.push({ name: group });
    for (const [name, method] of Object.entries(methods)) {
      const base = pascal(group, name);
      const input = component(method.input, 'input', `${base}Input`, schemas);
      const output = component(method.output, 'output', `${base}Output`, schemas);
      paths[`/api/compute/${group}/${name}`] = {
        post: {
          operationId: `${group}.${name}`,
          tags: [group],
          summary: method.summary,
          ...(method.action
            ? { description: `IAM action: \`${method.action}\`.`, 'x-iam-action': method.action }
            : {}),
          security: [{ bearer: [] }],
          parameters: [{ $ref: '#/components/parameters/XBetterCompute' }],
          requestBody: { required: true, content: { 'application/json': { schema: input } } },
          responses: {
            '200': {
              description: 'The answer',
              content: {
                'application/json': {
                  schema: { type: 'object', required: ['data'], properties: { data: output } },
                },
              },
            },
            ...errorResponses,
          },
        },
      };
    }
  }

  paths['/api/compute/events/stream'] = {
    get: {
      operationId: 'events.stream',
      tags: ['events'],
      summary:
        'Server-sent events: every outbox event the credential may read, live. Reconnect with Last-Event-ID (the last seq seen) to resume without losing or repeating one.',
      security: [{ bearer: [] }],
      parameters: [
        { name: 'subject', in: 'query', required: false, schema: { type: 'string' } },
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
          description: 'Like Last-Event-ID, for clients that cannot set headers.',
          schema: { type: 'string', pattern: '^\\d+$' },
        },
        { name: 'type', in: 'query', required: false, schema: { type: 'array', items: { type: 'string' } } },
        {
          name: 'Last-Event-ID',
          in: 'header',
          required: false,
          description: 'Resume after this seq; without it the stream starts with the next event.',
          schema: { type: 'string', pattern: '^\\d+$' },
        },
      ],
      responses: {
        '200': {
          description:
            'A `text/event-stream`: each frame has `id` (the seq), `event` (the type) and `data` (an Event).',
          content: { 'text/event-stream': { schema: { type: 'string' } } },
        },
        ...errorResponses,
      },
    },
  };
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
      description:
        'Every method is `POST /api/compute/{group}/{method}` with a JSON body, `Authorization: Bearer <token>` and `X-Better-Compute: 1`. It answers `{ data }` or `{ error: { code, message, details?, requestId } }`.',
    },
    ...(options.servers?.length ? { servers: options.servers.map((url) => ({ url })) } : {}),
    tags,
    paths,
    components: {
      schemas,
      parameters: {
        XBetterCompute: {
          name: 'X-Better-Compute',
          in: 'header',
          required: true,
          description: 'Must be `1` on every call, so a form on another site cannot post to the API.',
          schema: { type: 'string', const: '1' },
        },
      },
      securitySchemes: {
        bearer: { type: 'http', scheme: 'bearer', description: 'An API token (`tokens create`).' },
      },
    },
  };
}

export type OpenApiDocument = ReturnType<typeof buildOpenApiDocument>;
