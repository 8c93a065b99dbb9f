import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { beforeAll, describe, expect, test } from 'vitest';
import { methods } from '../../api/registry.ts';
import { operatorCommandKindNames } from '../../domain/command-kinds.ts';
import { useTestApi } from '../support/api.ts';

const api = useTestApi();
let document: Record<string, any>;
beforeAll(async () => {
  const response = await fetch(`${api.url}/api/compute/openapi.json`);
  expect(response.status).toBe(200);
  document = (await response.json()) as Record<string, any>;
});

describe('the OpenAPI document served by the API', () => {
  test('is a valid OpenAPI 3.1 document whose references all resolve', async () => {
    const validator = new Validator();
    const result = await validator.validate(structuredClone(document));
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe('3.1');
    expect(() => validator.resolveRefs()).not.toThrow();
  });

  test('has one operation per registry method, with its summary and the error envelope', () => {
    for (const [group, groupMethods] of Object.entries(methods)) {
      for (const [name, method] of Object.entries(groupMethods)) {
        const operation = document.paths[`/api/compute/${group}/${name}`]?.post;
        expect(operation, `${group}.${name}`).toBeDefined();
        expect(operation.operationId).toBe(`${group}.${name}`);
        expect(operation.summary).toBe(method.summary);
        expect(operation.responses['400'].$ref).toBe('#/components/responses/Error400');
        expect(operation.requestBody.required).toBe(!method.input.safeParse({}).success);
      }
    }
    expect(document.paths['/api/compute/events/stream'].get.responses['200'].content).toHaveProperty(
      'text/event-stream',
    );
    const badInput = document.components.responses.Error400.content['application/json'].schema;
    expect(badInput.allOf[1].properties.error.properties.code.enum).toEqual(['INVALID_INPUT']);
    expect(document.components.responses.Error422.description).toContain('UNSUPPORTED');
    expect(document.components.responses.Error429.headers).toHaveProperty('Retry-After');
    expect(document.components.responses.MethodNotAllowed.headers.Allow.required).toBe(true);
  });

  test('states the bounds the server enforces: durations, exactly one of until and by, node only with its binding', () => {
    const ajv = new Ajv2020({ strict: false });
    ajv.addSchema({ $id: 'doc', components: document.components }, 'doc');
    const validate = (name: string, value: unknown) =>
      ajv.validate({ $ref: `doc#/components/schemas/${name}` }, value);
    const create = (extra: Record<string, unknown>) => ({
      tenantId: 'acme',
      poolId: 'pool_1',
      devices: [{ class: 'gpu', count: 1 }],
      duration: '1h',
      idempotencyKey: 'k',
      ...extra,
    });
    for (const duration of ['1m', '0.5h', ' 90d ', 60_000, 7_776_000_000, '12.857w']) {
      expect(validate('ReservationsCreateInput', create({ duration })), String(duration)).toBe(true);
    }
    for (const duration of ['0ms', '59s', '91d', '90.01d', 59_999, 7_776_000_001, '13w', '']) {
      expect(validate('ReservationsCreateInput', create({ duration })), String(duration)).toBe(false);
    }
    expect(validate('ReservationsCreateInput', create({ node: { profileId: 'p' } }))).toBe(false);
    expect(validate('ReservationsCreateInput', create({ node: { profileId: 'p' }, binding: 'node' }))).toBe(
      true,
    );
    const extend = { tenantId: 'acme', reservationId: 'rsv_1', idempotencyKey: 'k' };
    expect(validate('ReservationsExtendInput', { ...extend, by: '1h' })).toBe(true);
    expect(validate('ReservationsExtendInput', { ...extend, until: 1 })).toBe(true);
    expect(validate('ReservationsExtendInput', { ...extend, by: '1h', until: 1 })).toBe(false);
    expect(validate('ReservationsExtendInput', extend)).toBe(false);
    expect(validate('NodesCordonInput', { nodeId: `node_${'0'.repeat(26)}`, reason: 'a\u0000b' })).toBe(
      false,
    );
  });

  test("states each command kind's payload: nodes.command is one variant per kind an operator may queue", () => {
    const ajv = new Ajv2020({ strict: false });
    ajv.addSchema({ $id: 'doc', components: document.components }, 'doc');
    const schema =
      document.paths['/api/compute/nodes/command'].post.requestBody.content['application/json'].schema;
    const validate = (value: unknown) => ajv.validate({ $ref: `doc${schema.$ref}` }, value);
    const resolved = document.components.schemas[String(schema.$ref).split('/').at(-1)!];
    expect(
      resolved.oneOf.map(
        (variant: { properties: { kind: { const: string } } }) => variant.properties.kind.const,
      ),
    ).toEqual(operatorCommandKindNames);
    const nodeId = `node_${'0'.repeat(26)}`;
    expect(validate({ nodeId, kind: 'gpu.reset', payload: { gpuUuid: 'GPU-1' } })).toBe(true);
    expect(validate({ nodeId, kind: 'gpu.reset' })).toBe(false); // its payload names the GPU
    expect(validate({ nodeId, kind: 'gpu.reset', payload: { level: 'full' } })).toBe(false);
    expect(validate({ nodeId, kind: 'diag.nvml' })).toBe(true); // a payload that may be empty may be left out
    expect(validate({ nodeId, kind: 'diag.nvml', payload: { level: 'slow' } })).toBe(false);
    expect(validate({ nodeId, kind: 'inventory.refresh', payload: { extra: 1 } })).toBe(false);
    expect(validate({ nodeId, kind: 'bmc.power', payload: { action: 'on' } })).toBe(false); // the control plane's own
  });

  test('its schemas are the zod schemas: strict inputs refuse unknown fields, defaults are optional', () => {
    const ajv = new Ajv2020({ strict: false, allErrors: true });
    ajv.addSchema({ $id: 'doc', components: document.components }, 'doc');
    const validate = (name: string, value: unknown) =>
      ajv.validate({ $ref: `doc#/components/schemas/${name}` }, value);
    expect(validate('EventsListInput', { subject: 'reservation/rsv_1', types: ['reservation.*'] })).toBe(
      true,
    );
    expect(validate('EventsListInput', {})).toBe(true);
    expect(validate('EventsListInput', { colour: 'red' })).toBe(false);
    expect(validate('EventsListInput', { limit: 0 })).toBe(false);
    expect(validate('SystemWhoamiOutput', { identityId: 'i', tenantId: 't' })).toBe(false);
  });
});
