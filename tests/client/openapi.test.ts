import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { beforeAll, describe, expect, test } from 'vitest';
import { methods } from '../../api/registry.ts';
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
        expect(operation.responses['400'].content['application/json'].schema.$ref).toBe(
          '#/components/schemas/ErrorEnvelope',
        );
      }
    }
    expect(document.paths['/api/compute/events/stream'].get.responses['200'].content).toHaveProperty(
      'text/event-stream',
    );
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
