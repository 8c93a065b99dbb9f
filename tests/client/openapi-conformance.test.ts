/**
 * The OpenAPI document against the server it describes. For every operation, requests generated
 * from the document's own request schema (fast-check, from the JSON Schema alone, known ids mixed
 * in so that calls reach real resources) are sent as the platform's root administrator and as a
 * tenant's administrator and member: none may be refused as INVALID_INPUT, except by the business
 * rules listed below (each one depends on the state or the clock, which no schema can state). Every
 * answer, success or error, must carry a status the operation documents and a body (and headers)
 * that validate against the document's schema for that status. The event stream's frames, the 405
 * answers and bodies left out where the document says a body is optional are checked the same way.
 * FUZZ_SEED and FUZZ_RUNS (per method and caller) change the generated requests.
 */
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { methods } from '../../api/registry.ts';
import { insertMetalWorkflow } from '../../db/metal/workflows.ts';
import { planInspect } from '../../domain/metal-steps.ts';
import {
  generateReleaseSigningKey,
  type ReleaseManifest,
  releaseFileEntry,
  signRelease,
} from '../../domain/release-manifest.ts';
import { currentProtocolVersion } from '../../domain/release-version.ts';
import { type Compute, createCompute } from '../../server/compute.ts';
import { markNodesHeard, type SeededPool, seedPool } from '../support/fleet.ts';
import { arbitraryFromSchema, type JsonSchema } from '../support/json-schema-arbitrary.ts';
import { testLogger } from '../support/logger.ts';
import { type MetalSite, startMetalSite } from '../support/metal-site.ts';
import { useTempDir } from '../support/temp-dir.ts';
import { startTestTemporal, type TestTemporal } from '../support/temporal.ts';
import { createTwoTenants, type TwoTenants } from '../support/two-tenants.ts';

const seed = Number(process.env.FUZZ_SEED ?? 20_261_117);
const runs = Number(process.env.FUZZ_RUNS ?? 12);
/** Generated requests tried per method, when none of those before it succeeded. */
const successSamples = 300;
/** Of those, sent at once (the first success ends the method's search). */
const successBatch = 4;

/**
 * A test's time limit from the number of requests it sends: ~20 ms each in process, 10 times that
 * allowed so that a machine loaded by other runs slows it down without failing it.
 */
function timeoutFor(requests: number, perRequestMs = 200): number {
  return 30_000 + requests * perRequestMs;
}

/** Every method of the registry (`group.name`), which is every operation of the document. */
const methodIds = Object.entries(methods).flatMap(([group, m]) =>
  Object.keys(m).map((name) => `${group}.${name}`),
);

/**
 * INVALID_INPUT answers that are business rules, not schema: `method` → the field the refusal names
 * → why no schema can state the rule (it depends on the state, the clock or the network). Such a
 * refusal never carries `details.issues`, which every schema refusal does.
 */
const businessRules: Record<string, Record<string, string>> = {
  'reservations.create': {
    start:
      "a start lies within 5 minutes before and the pool's horizon (calendar.horizonDays, 90 by default) after the clock of the database",
    devices: "the device class must be the one the pool shares its GPUs as (the pool's sharing mode)",
    binding: "a binding must be one the pool offers (policy.kubernetes, a tenantRoot pool for 'node')",
  },
  'capacity.preview': {
    start:
      "a start lies within 5 minutes before and the pool's horizon (calendar.horizonDays, 90 by default) after the clock of the database",
    devices: "the device class must be the one the pool shares its GPUs as (the pool's sharing mode)",
    binding: "a binding must be one the pool offers (policy.kubernetes, a tenantRoot pool for 'node')",
  },
  'reservations.extend': {
    until: 'a reservation lasts at most 90 days from its start, which the reservation holds',
    by: 'a reservation lasts at most 90 days from its start, which the reservation holds',
  },
  'webhooks.create': {
    url: 'a target must parse as a URL, be https (outside the allowlist) and resolve to public addresses only, by DNS at the time',
  },
  'images.register': {
    signature:
      'a signature must verify over the image with the Ed25519 key it names (and the key id be that key’s pin): cryptography, not a shape',
  },
  'nodes.setMigLayout': {
    gpus: 'a GPU must be one the node has, which only its inventory knows',
  },
  'admin.withdrawOffer': {
    tenantId:
      'the tenant must be offered the pool, not own it (an owner has no offer): which only the pools know',
  },
  'admin.createIdentity': {
    personIdentityId: 'the identity an agent acts for must be a person, which only the directory knows',
  },
  'releases.publish': {
    signatures:
      'k distinct signatures must verify over the manifest with Ed25519 keys whose pins this control plane trusts: cryptography and configuration, not a shape',
    files:
      "each file's bytes must have the size and SHA-256 the manifest lists for its path, every listed path given once: a relation between two fields",
    'manifest.expiresAt': 'a release must not have expired by the clock',
    'manifest.protocolVersion':
      "a release must speak this control plane's session protocol or one of the two before it, which depends on the version running",
    'manifest.minControlPlaneVersion': 'a release may not need a newer control plane than the one running',
  },
  'rollouts.create': {
    waves:
      'cumulative percentages must increase from one wave to the next and end at 100: an order between items',
    selector: 'a selector must name pools or labels and pick at least one node, which only the fleet knows',
  },
};

/**
 * Refusals the document does not state yet, in files this suite does not own: `method` → field →
 * what to change. They are tolerated (and printed) so that the rest stays checked; fix the schema,
 * then remove the line.
 */
const knownGaps: Record<string, Record<string, string>> = {};

/**
 * Methods whose success this world cannot reach, and the test that validates their success
 * instead: a deploy needs an inspected machine whose ramdisk joins through a site agent.
 */
const successValidatedElsewhere: Record<string, string> = {
  'metal.deploy': 'tests/metal/deploy.test.ts',
  'metal.abort': 'tests/metal/deploy.test.ts',
  'metal.retry': 'tests/metal/deploy.test.ts',
};

let w: TwoTenants;
/** The API the generated requests go to: the world's, with Temporal and the release signer pinned. */
let app: Compute['app'];
/** Temporal (dev server and a worker): rollouts run as workflows. */
let temporal: TestTemporal;
/** The release signer the control plane pins (the project's own signing code). */
const releaseSigner = generateReleaseSigningKey();
/** A pool of its own for the rollout (one node that never answers, so the rollout stays running). */
let rolloutPool: SeededPool;
let rolloutId: string | undefined;
/** A real site (gateway, site agent, Redfish emulator) so the `metal.*` BMC calls can succeed. */
let metal: MetalSite;
const metalDir = useTempDir('bc-conformance-metal-');
// biome-ignore lint/suspicious/noExplicitAny: the OpenAPI document, read by key.
let document: Record<string, any>;
const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
const compiled = new Map<string, ValidateFunction>();
const tally = { requests: 0, answered: 0, refused: 0, validated: 0 };
const succeededMethods = new Set<string>();

/** A JSON pointer into the document, for ajv (`doc#/paths/~1api~1…`). */
const pointer = (...parts: string[]) =>
  `doc#/${parts.map((p) => p.replaceAll('~', '~0').replaceAll('/', '~1')).join('/')}`;

function validatorAt(ref: string): ValidateFunction {
  let validate = compiled.get(ref);
  if (!validate) {
    validate = ajv.compile({ $ref: ref });
    compiled.set(ref, validate);
  }
  return validate;
}

function resolve(ref: string): JsonSchema {
  let node: unknown = document;
  for (const part of ref.replace(/^#\//, '').split('/')) {
    node = (node as Record<string, unknown>)[part.replaceAll('~1', '/').replaceAll('~0', '~')];
  }
  if (!node) throw new Error(`unresolved ${ref}`);
  return node as JsonSchema;
}

/** The response object of `status`, following a `$ref` to `components.responses`; its pointer too. */
function documentedResponse(path: string, method: string, status: number) {
  const responses = document.paths[path]?.[method]?.responses ?? {};
  const response = responses[String(status)];
  if (!response) return null;
  if (response.$ref) {
    const name = String(response.$ref).split('/').at(-1)!;
    return { response: resolve(response.$ref), at: ['components', 'responses', name] };
  }
  return { response, at: ['paths', path, method, 'responses', String(status)] };
}

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  body: unknown;
}

/** What is wrong with an answer against the document (null: nothing). */
function checkAgainstDocument(path: string, method: string, answer: Answer): string | null {
  const documented = documentedResponse(path, method, answer.status);
  if (!documented) return `HTTP ${answer.status} is not documented: ${answer.text.slice(0, 300)}`;
  const { response, at } = documented;
  for (const [name, header] of Object.entries((response.headers ?? {}) as Record<string, JsonSchema>)) {
    const value = answer.headers.get(name);
    if (value === null) {
      if (header.required) return `HTTP ${answer.status} without its ${name} header`;
      continue;
    }
    if (!validatorAt(pointer(...at, 'headers', name, 'schema'))(value)) {
      return `${name}: ${value} does not match the document`;
    }
  }
  const validate = validatorAt(pointer(...at, 'content', 'application/json', 'schema'));
  if (!validate(answer.body)) {
    return `HTTP ${answer.status} body does not validate: ${ajv.errorsText(validate.errors)}\n  ${answer.text.slice(0, 400)}`;
  }
  tally.validated++;
  return null;
}

/** The field an INVALID_INPUT answer names first, and whether it came from a schema (`details.issues`). */
function refusedField(body: unknown): { field: string; bySchema: boolean } {
  const error = (body as { error?: { message?: string; details?: Record<string, unknown> } }).error;
  const issues = error?.details?.issues as Array<{ field: string }> | undefined;
  const field =
    (error?.details?.field as string | undefined) ??
    issues?.[0]?.field ??
    error?.message?.match(/^([\w.[\]]+):/)?.[1] ??
    '(unnamed)';
  return { field, bySchema: issues !== undefined };
}

const gapsMet = new Set<string>();

/** The entry of `table` for `field` or a field that contains it (`devices` for `devices[0].class`). */
function entryFor(table: Record<string, string> | undefined, field: string): string | undefined {
  const key = Object.keys(table ?? {}).find(
    (k) => field === k || field.startsWith(`${k}.`) || field.startsWith(`${k}[`),
  );
  return key === undefined ? undefined : `${key}: ${table![key]}`;
}

/** Whether an INVALID_INPUT answer is a business rule or a known gap (listed above). */
function isExpectedRefusal(operationId: string, body: unknown): boolean {
  const { field, bySchema } = refusedField(body);
  const gap = entryFor(knownGaps[operationId], field);
  if (gap) {
    gapsMet.add(`${operationId} ${gap}`);
    return true;
  }
  return !bySchema && entryFor(businessRules[operationId], field) !== undefined;
}

async function send(
  path: string,
  init: { method?: string; token?: string | null; body?: string },
): Promise<Answer> {
  const response = await app.request(path, {
    method: init.method ?? 'POST',
    headers: {
      'content-type': 'application/json',
      'x-better-compute': '1',
      ...(init.token ? { authorization: `Bearer ${init.token}` } : {}),
    },
    ...(init.body !== undefined ? { body: init.body } : {}),
    // A bounded wait (reservations.create's `wait`) ends when the caller goes away.
    signal: AbortSignal.timeout(3_000),
  });
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  tally.requests++;
  if (response.status === 200) tally.answered++;
  else tally.refused++;
  return { status: response.status, headers: response.headers, text, body };
}

/**
 * Calls `method` expecting a success whose answer the document describes; otherwise adds to
 * `failures` what went wrong. Answers the body.
 */
async function callExpectingSuccess(
  failures: string[],
  token: string,
  method: string,
  body: Record<string, unknown>,
) {
  const answer = await send(`/api/compute/${method}`, { token, body: JSON.stringify(body) });
  const problem =
    answer.status === 200
      ? checkAgainstDocument(`/api/compute/${method}`, 'post', answer)
      : answer.text.slice(0, 300);
  if (problem) failures.push(`${method}: ${problem}`);
  else succeededMethods.add(method.replace('/', '.'));
  return answer.body as {
    data?: Record<string, unknown>;
    error?: { details?: Record<string, unknown> };
  };
}

/** Real ids by the name of the field that takes them, mixed into generated requests. */
function knownValues(): Record<string, unknown[]> {
  const sides = [w.a, w.b];
  const nodes = [...sides.flatMap((s) => s.ownPool.nodes), ...w.sharedPool.nodes].map((n) => n.id);
  const tenants = sides.map((s) => s.tenantId);
  const identities = sides.flatMap((s) => [s.member.identityId, s.admin.identityId]);
  return {
    tenantId: tenants,
    parentId: tenants,
    ownerTenantId: tenants,
    poolId: [w.sharedPool.poolId, ...sides.map((s) => s.ownPool.poolId)],
    siteId: [w.sharedPool.siteId, metal.siteId],
    nodeId: [...nodes, ...metal.machines],
    reservationId: Object.values(w.ofB.reservations),
    webhookId: Object.values(w.ofB.webhooks),
    commandId: [w.ofB.command.commandId],
    tokenId: [...Object.values(w.ofB.joinTokens), w.ofB.spareTokenId],
    identityId: identities,
    personIdentityId: identities,
    confirmationId: [w.ofB.confirmationId],
    delegationId: [w.ofB.delegationId],
    role: ['member', 'viewer', 'admin'],
    // No releaseId: a generated rollouts.create would then roll it out over the tenants' pools.
    ...(rolloutId ? { rolloutId: [rolloutId] } : {}),
    duration: ['1h', '90m', 3_600_000],
    by: ['1h'],
  };
}

/** The request schema with known values offered beside each top-level property that takes one. */
function withKnownValues(schema: JsonSchema): JsonSchema {
  const resolved = schema.$ref ? resolve(schema.$ref) : schema;
  if (!resolved.properties) return resolved;
  const known = knownValues();
  const properties = Object.fromEntries(
    Object.entries(resolved.properties as Record<string, JsonSchema>).map(([name, property]) => [
      name,
      known[name] ? { anyOf: [property, { enum: known[name] }] } : property,
    ]),
  );
  return { ...resolved, properties };
}

interface Operation {
  operationId: string;
  path: string;
  bodyRequired: boolean;
  bodySchema: JsonSchema;
  bodyRef: string;
}

function operations(): Operation[] {
  const out: Operation[] = [];
  for (const [path, item] of Object.entries(document.paths as Record<string, Record<string, JsonSchema>>)) {
    const post = item.post;
    if (!post) continue;
    const schema = post.requestBody.content['application/json'].schema as JsonSchema;
    out.push({
      operationId: post.operationId,
      path,
      bodyRequired: post.requestBody.required === true,
      bodySchema: schema,
      bodyRef: pointer('paths', path, 'post', 'requestBody', 'content', 'application/json', 'schema'),
    });
  }
  return out;
}

beforeAll(async () => {
  w = await createTwoTenants();
  metal = await startMetalSite({
    db: w.api.database.db,
    config: w.api.deps.config,
    call: async (method, body) => {
      const answer = await w.call(w.root.token, method, body);
      if (answer.status !== 200)
        throw new Error(`${method}: ${answer.status} ${JSON.stringify(answer.body)}`);
      return answer.body.data;
    },
    dir: metalDir,
    log: testLogger('conformance-metal'),
    machines: 1,
  });
  temporal = await startTestTemporal({
    name: 'conformance',
    db: w.api.database.db,
    log: testLogger('conformance-temporal'),
    iam: w.api.iam,
    timers: {},
  });
  app = createCompute({
    ...w.api.deps,
    temporal: temporal.client,
    config: {
      ...w.api.deps.config,
      BETTER_COMPUTE_TASK_QUEUE: temporal.taskQueue,
      BETTER_COMPUTE_RELEASE_PINS: [releaseSigner.pin],
    },
  }).app;
  rolloutPool = await seedPool(w.api.database.db, {
    siteId: w.sharedPool.siteId,
    ownerTenantId: w.root.tenantId,
    name: 'conformance-rollout',
    nodes: 1,
    namePrefix: 'rollout-node',
    policy: { disruption: { maxUnavailable: 1, soakSeconds: 3_600, gateTimeoutSeconds: 3_600 } },
  });
  const served = await w.api.compute.app.request('/api/compute/openapi.json');
  document = (await served.json()) as Record<string, unknown>;
  ajv.addSchema({ ...document, $id: 'doc' }, 'doc');
}, 600_000);

afterAll(async () => {
  console.log(
    `OpenAPI conformance: ${tally.requests} requests (${tally.answered} answered, ${tally.refused} refused; ` +
      `${tally.validated} answers validated against the document; ${succeededMethods.size} methods answered with data; seed ${seed})`,
  );
  const silent = operations().filter((o) => !succeededMethods.has(o.operationId));
  if (silent.length > 0) {
    console.log(
      `OpenAPI conformance: never answered with data: ${silent.map((o) => o.operationId).join(', ')}`,
    );
  }
  for (const gap of gapsMet) console.log(`OpenAPI known gap met: ${gap}`);
  await temporal?.stop();
  await metal?.stop();
  await w?.stop();
});

describe('the OpenAPI document against the server', () => {
  it('is a valid OpenAPI 3.1 document', async () => {
    const result = await new Validator().validate(structuredClone(document));
    expect(result.errors ?? []).toEqual([]);
  });

  it('has one operation per method of the registry', () => {
    const registry = Object.entries(methods).flatMap(([group, m]) =>
      Object.keys(m).map((name) => `${group}.${name}`),
    );
    expect(
      operations()
        .map((o) => o.operationId)
        .sort(),
    ).toEqual(registry.sort());
  });

  // Before the generated requests, which may retire the node this one sends a command to.
  it('sends event stream frames as the document describes them', async () => {
    const stream =
      document.paths['/api/compute/events/stream'].get.responses['200'].content['text/event-stream'];
    expect(stream['x-itemSchema']).toEqual({ $ref: '#/components/schemas/EventStreamFrame' });
    const validateFrame = validatorAt('doc#/components/schemas/EventStreamFrame');
    const aborted = new AbortController();
    const response = await w.api.compute.app.request('/api/compute/events/stream', {
      headers: { authorization: `Bearer ${w.root.token}` },
      signal: aborted.signal,
    });
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    const frames: Array<Record<string, unknown>> = [];
    let buffered = '';
    let commandId: string | undefined;
    const ours = (f: Record<string, unknown>) =>
      commandId !== undefined && (f.data as { data?: { commandId?: string } }).data?.commandId === commandId;
    try {
      while (!frames.some(ours)) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += value;
        let end = buffered.indexOf('\n\n');
        while (end >= 0) {
          const lines = buffered.slice(0, end).split('\n');
          buffered = buffered.slice(end + 2);
          end = buffered.indexOf('\n\n');
          if (lines.every((line) => line.startsWith(':'))) continue;
          const frame: Record<string, unknown> = {};
          for (const line of lines) {
            const colon = line.indexOf(':');
            const [field, text] = [line.slice(0, colon), line.slice(colon + 1).replace(/^ /, '')];
            frame[field] = field === 'data' ? JSON.parse(text) : text;
          }
          frames.push(frame);
        }
        if (commandId === undefined && frames.length > 0) {
          // One event after the stream is ready: a command queued on a node of the shared pool.
          const queued = await send('/api/compute/nodes/command', {
            token: w.root.token,
            body: JSON.stringify({ nodeId: w.sharedPool.nodes[3]!.id, kind: 'inventory.refresh' }),
          });
          expect(queued.status, queued.text).toBe(200);
          commandId = (queued.body as { data: { id: string } }).data.id;
        }
      }
    } finally {
      aborted.abort();
      await reader.cancel().catch(() => {});
    }
    expect(frames[0]!.event).toBe('ready');
    expect(frames.find(ours)?.event).toBe('node.command-queued');
    for (const frame of frames)
      expect(validateFrame(frame), `${JSON.stringify(frame)}: ${ajv.errorsText(validateFrame.errors)}`).toBe(
        true,
      );
  });

  // Calls that succeed, for the methods generated requests rarely get through (and before them:
  // they may revoke the agent's delegation or retire nodes).
  it(
    'documents the answer of a call that succeeds, for every method generated requests seldom get through',
    async () => {
      const now = Date.now(); // wall time: a start well inside the horizon, whatever the database's clock
      await markNodesHeard(
        w.api.database.db,
        w.sharedPool.nodes.map((n) => n.id),
      );
      const acme = {
        tenantId: w.a.tenantId,
        poolId: w.sharedPool.poolId,
        devices: [{ class: 'gpu', count: 1 }],
        duration: '1h',
      };
      const calls: Array<[string, string, Record<string, unknown>]> = [
        [w.a.member.token, 'reservations/create', { ...acme, idempotencyKey: 'conformance-create' }],
        [w.a.member.token, 'capacity/preview', acme],
        [w.a.admin.token, 'webhooks/create', { tenantId: w.a.tenantId, url: 'http://127.0.0.1:9/acme-hook' }],
        [
          w.root.token,
          'admin/applyPolicy',
          {
            tenantId: w.a.tenantId,
            name: 'conformance',
            document: { statements: [{ effect: 'allow', actions: ['compute:events:read'] }] },
          },
        ],
        [w.b.admin.token, 'nodes/getCommand', w.ofB.command],
        [w.root.token, 'nodes/approveReclaim', { nodeId: w.ofB.command.nodeId }],
        [w.root.token, 'nodes/setMigLayout', { nodeId: w.ofB.command.nodeId, gpus: [] }],
        [w.b.member.token, 'confirmations/approve', { confirmationId: w.ofB.confirmationId }],
        [
          w.b.member.token,
          'reservations/get',
          { tenantId: w.b.tenantId, reservationId: w.ofB.reservations.read },
        ],
        [
          w.b.member.token,
          'reservations/release',
          { tenantId: w.b.tenantId, reservationId: w.ofB.reservations.release },
        ],
        [w.b.admin.token, 'webhooks/deliveries', { tenantId: w.b.tenantId, webhookId: w.ofB.webhooks.read }],
        [w.b.admin.token, 'webhooks/delete', { tenantId: w.b.tenantId, webhookId: w.ofB.webhooks.remove }],
        [
          w.b.admin.token,
          'nodes/command',
          { nodeId: w.ofB.command.nodeId, kind: 'diag.nvml', payload: { level: 'full' } },
        ],
        [
          w.b.member.token,
          'reservations/extend',
          {
            tenantId: w.b.tenantId,
            reservationId: w.ofB.reservations.extend,
            by: '30m',
            idempotencyKey: 'conformance',
          },
        ],
        [w.root.token, 'admin/revokeToken', { tokenId: w.ofB.spareTokenId }],
        // Through the site agent to the Redfish emulator (see startMetalSite).
        [w.root.token, 'metal/inventory', { nodeId: metal.machines[0], waitSeconds: 5 }],
        [w.root.token, 'metal/bootDevice', { nodeId: metal.machines[0], device: 'pxe', waitSeconds: 0 }],
        [w.root.token, 'metal/power', { nodeId: metal.machines[0], action: 'on', waitSeconds: 0 }],
        [
          w.root.token,
          'metal/virtualMedia',
          {
            nodeId: metal.machines[0],
            action: 'insert',
            imageUrl: 'http://127.0.0.1:9/ramdisk.iso',
            waitSeconds: 0,
          },
        ],
      ];
      const failures: string[] = [];
      const expectOk = (token: string, method: string, body: Record<string, unknown>) =>
        callExpectingSuccess(failures, token, method, body);
      for (const [token, method, body] of calls) await expectOk(token, method, body);
      // Bare metal: a site, a machine enrolled at the emulator, an image, a profile, maintenance.
      await expectOk(w.root.token, 'sites/create', { name: 'conformance-site', region: 'eu-west-1' });
      const enrolled = await expectOk(w.root.token, 'metal/enroll', {
        siteId: metal.siteId,
        poolId: metal.poolId,
        name: 'conformance-machine',
        bmc: { address: metal.emulator.address, systemId: 'conformance-1', username: 'u', password: 'p' },
        inspect: false,
      });
      await expectOk(w.root.token, 'metal/getMachine', { nodeId: enrolled.data?.nodeId });
      await expectOk(w.root.token, 'nodes/setMaintenance', {
        nodeId: enrolled.data?.nodeId,
        reason: 'conformance',
      });
      await expectOk(w.root.token, 'nodes/clearMaintenance', { nodeId: enrolled.data?.nodeId });
      await expectOk(w.root.token, 'nodes/taint', { nodeId: enrolled.data?.nodeId, reason: 'conformance' });
      await expectOk(w.root.token, 'nodes/untaint', { nodeId: enrolled.data?.nodeId, reason: 'conformance' });
      const image = await expectOk(w.a.admin.token, 'images/register', {
        name: 'conformance',
        version: '1',
        format: 'raw',
        sha256: 'a'.repeat(64),
        url: 'http://127.0.0.1:9/conformance.raw',
      });
      await expectOk(w.a.admin.token, 'images/get', { imageId: image.data?.id });
      const profile = await expectOk(w.a.admin.token, 'profiles/create', {
        name: 'conformance',
        spec: { imageId: image.data?.id },
      });
      await expectOk(w.a.admin.token, 'profiles/get', { profileId: profile.data?.id });
      // A provisioning workflow as the database holds it (starting one needs Temporal, which this
      // suite does not run: metal.deploy, metal.abort and metal.retry answer UNAVAILABLE here).
      const inspection = await w.api.database.db.transaction().execute((trx) =>
        insertMetalWorkflow(trx, {
          kind: 'inspect',
          nodeId: enrolled.data?.nodeId as string,
          tenantId: w.root.tenantId,
          profileId: null,
          profileVersion: null,
          idempotencyKey: 'conformance',
          steps: planInspect({ maxAttempts: 1 }),
          verb: 'conformance',
        }),
      );
      await expectOk(w.root.token, 'workflows/get', { workflowId: inspection.workflowId });
      // Host holds: a kind of the shared pool, a host that publishes its cores, one hold's lifecycle.
      const holdNode = w.sharedPool.nodes[0]!.id;
      await w.api.database.db
        .insertInto('host_resources')
        .values([
          // Room for the reservations later requests place on this node too (per-GPU host shares).
          { node_id: holdNode, resource: 'vcpu', capacity: 1024, allocatable: 1024 },
          { node_id: holdNode, resource: 'memoryGiB', capacity: 16384, allocatable: 16384 },
        ])
        .onConflict((oc) => oc.doNothing())
        .execute();
      await expectOk(w.root.token, 'holds/kinds.set', {
        tenantId: w.root.tenantId,
        pool: w.sharedPool.poolId,
        name: 'conformance',
        cpuCores: 1,
        ramGiB: 1,
      });
      const hold = await expectOk(w.a.member.token, 'holds/create', {
        tenantId: w.a.tenantId,
        target: holdNode,
        kind: 'conformance',
      });
      const holdRef = { tenantId: w.a.tenantId, holdId: hold.data?.id };
      await expectOk(w.a.member.token, 'holds/heartbeat', holdRef);
      await expectOk(w.a.member.token, 'holds/get', holdRef);
      await expectOk(w.a.member.token, 'holds/release', holdRef);
      const later = await expectOk(w.a.member.token, 'reservations/create', {
        ...acme,
        start: now + 86_400_000,
        idempotencyKey: 'conformance-later',
      });
      await expectOk(w.a.member.token, 'reservations/cancel', {
        tenantId: w.a.tenantId,
        reservationId: later.data?.id,
      });
      await markNodesHeard(
        w.api.database.db,
        w.sharedPool.nodes.map((n) => n.id),
      );
      const leased = await expectOk(w.a.member.token, 'reservations/create', {
        ...acme,
        leaseSeconds: 600,
        idempotencyKey: 'conformance-lease',
      });
      await expectOk(w.a.member.token, 'reservations/renew', {
        tenantId: w.a.tenantId,
        reservationId: leased.data?.id,
      });
      const held = await send('/api/compute/reservations/create', {
        token: w.ofB.agentToken,
        body: JSON.stringify({ ...acme, tenantId: w.b.tenantId, idempotencyKey: 'conformance-agent' }),
      });
      expect(checkAgainstDocument('/api/compute/reservations/create', 'post', held)).toBeNull();
      const confirmationId = (held.body as { error?: { details?: { confirmationId?: string } } }).error
        ?.details?.confirmationId;
      await expectOk(w.b.member.token, 'confirmations/deny', { confirmationId });
      expect(failures).toEqual([]);
      // About 60 calls; the metal ones go through the site agent to the emulator (seconds each under load).
    },
    timeoutFor(60, 1_000),
  );

  // Releases and rollouts need the release signer pinned and Temporal (the world has both).
  it(
    'documents the answers of releases and rollouts: a signed release rolled out, paused, resumed and aborted',
    async () => {
      const now = Date.now(); // wall time: an expiry well after the database's clock
      const failures: string[] = [];
      const expectOk = (token: string, method: string, body: Record<string, unknown>) =>
        callExpectingSuccess(failures, token, method, body);
      // A bcd release signed with the project's own signing code, rolled out over the rollout pool;
      // its one node never answers, so the rollout stays running through pause, resume and abort.
      const files = new Map([['bin/bcd', Buffer.from('#!/bin/sh\n# conformance bcd 9.0.0\n')]]);
      const manifest: ReleaseManifest = {
        channel: 'stable',
        version: '9.0.0',
        protocolVersion: currentProtocolVersion,
        minControlPlaneVersion: '0.1.0',
        files: [...files].map(([path, content]) => releaseFileEntry(path, content)),
        expiresAt: new Date(now + 86_400_000).toISOString(),
      };
      const release = await expectOk(w.root.token, 'releases/publish', {
        manifest,
        signatures: [signRelease(manifest, releaseSigner.privateKeyPem)],
        files: [...files].map(([path, content]) => ({ path, content: content.toString('base64') })),
      });
      await expectOk(w.root.token, 'releases/list', { channel: 'stable' });
      await expectOk(w.root.token, 'releases/get', { releaseId: release.data?.id });
      const rollout = await expectOk(w.root.token, 'rollouts/create', {
        releaseId: release.data?.id,
        selector: { poolIds: [rolloutPool.poolId] },
        waves: [100],
        idempotencyKey: 'conformance-rollout',
      });
      rolloutId = rollout.data?.id as string;
      await expectOk(w.root.token, 'rollouts/list', { state: 'running' });
      const stateOf = async () =>
        (
          await send('/api/compute/rollouts/get', {
            token: w.root.token,
            body: JSON.stringify({ rolloutId }),
          })
        ).body as { data?: { state: string } };
      await expectOk(w.root.token, 'rollouts/pause', { rolloutId, reason: 'conformance' });
      // The signal's answer waits a bounded time on the workflow's step; resume needs it applied.
      await expect.poll(async () => (await stateOf()).data?.state, { timeout: 120_000 }).toBe('paused');
      await expectOk(w.root.token, 'rollouts/resume', { rolloutId });
      await expect.poll(async () => (await stateOf()).data?.state, { timeout: 120_000 }).toBe('running');
      await expectOk(w.root.token, 'rollouts/get', { rolloutId, nodes: true });
      await expectOk(w.root.token, 'rollouts/abort', { rolloutId });
      expect(failures).toEqual([]);
    },
    // Nine calls; the signals wait on the workflow's steps (seconds each under load).
    timeoutFor(10, 30_000),
  );

  const callers = () => [
    { name: 'root', token: w.root.token },
    { name: 'tenant admin', token: w.a.admin.token },
    { name: 'tenant member', token: w.a.member.token },
  ];

  // One test per method, its callers at once: a slow method has its own time limit, scaled by its
  // requests, and a failure names the method.
  it.each(methodIds)(
    '%s refuses no request its own schemas allow, and documents every answer',
    async (operationId) => {
      const operation = operations().find((o) => o.operationId === operationId)!;
      const validBody = validatorAt(operation.bodyRef);
      const bodies = arbitraryFromSchema(withKnownValues(operation.bodySchema), { resolve }).filter((v) =>
        validBody(v),
      );
      const failures: string[] = [];
      await Promise.all(
        callers().map(async (caller) => {
          // A request already sent by this caller proves nothing more (small schemas repeat).
          const sent = new Set<string>();
          const run = await fc.check(
            fc.asyncProperty(bodies, async (body) => {
              const text = JSON.stringify(body);
              if (sent.has(text)) return;
              sent.add(text);
              const answer = await send(operation.path, { token: caller.token, body: text });
              const problem = checkAgainstDocument(operation.path, 'post', answer);
              if (problem) throw new Error(problem);
              const code = (answer.body as { error?: { code?: string } }).error?.code;
              if (code === 'INVALID_INPUT' && !isExpectedRefusal(operation.operationId, answer.body)) {
                throw new Error(`a request its schema allows is refused: ${answer.text.slice(0, 400)}`);
              }
              if (answer.status === 200) succeededMethods.add(operation.operationId);
            }),
            { numRuns: runs, seed, endOnFailure: true },
          );
          if (run.failed) {
            const cause =
              run.errorInstance instanceof Error ? run.errorInstance.message : String(run.errorInstance);
            failures.push(
              `${operation.operationId} as ${caller.name}: ${cause}\n  request: ${JSON.stringify(run.counterexample?.[0]).slice(0, 400)}`,
            );
          }
        }),
      );
      expect(failures).toEqual([]);
    },
    timeoutFor(3 * runs),
  );

  it('accepts an absent body where the document says it is optional, and documents what it answers', async () => {
    const failures: string[] = [];
    for (const operation of operations().filter((o) => !o.bodyRequired)) {
      for (const body of [undefined, '']) {
        const answer = await send(operation.path, {
          token: w.a.admin.token,
          ...(body === undefined ? {} : { body }),
        });
        const problem = checkAgainstDocument(operation.path, 'post', answer);
        const code = (answer.body as { error?: { code?: string } }).error?.code;
        if (problem || code === 'INVALID_INPUT') {
          failures.push(`${operation.operationId} without a body: ${problem ?? answer.text.slice(0, 200)}`);
        }
      }
    }
    expect(failures).toEqual([]);
    expect(
      operations()
        .filter((o) => !o.bodyRequired)
        .map((o) => o.operationId),
    ).toContain('nodes.list');
  });

  it('documents the envelope of refusals before any method runs: no credential, bad JSON, too large, another HTTP method', async () => {
    const path = '/api/compute/reservations/list';
    const answers = [
      await send(path, { token: null, body: '{}' }),
      await send(path, { token: w.a.member.token, body: '{"tenantId":' }),
      await send(path, {
        token: w.a.member.token,
        body: JSON.stringify({ tenantId: 'x'.repeat(1024 * 1024) }),
      }),
    ];
    expect(answers.map((a) => a.status)).toEqual([401, 400, 400]);
    for (const answer of answers) expect(checkAgainstDocument(path, 'post', answer)).toBeNull();
    for (const [target, method] of [
      [path, 'GET'],
      [path, 'PUT'],
      ['/api/compute/openapi.json', 'POST'],
      ['/api/compute/events/stream', 'DELETE'],
    ] as const) {
      const answer = await send(target, { method, token: w.a.member.token });
      expect(answer.status, `${method} ${target}`).toBe(405);
      expect(answer.headers.get('allow')).toMatch(/^(POST|GET, HEAD)$/);
      const validate = validatorAt(
        pointer('components', 'responses', 'MethodNotAllowed', 'content', 'application/json', 'schema'),
      );
      expect(validate(answer.body), ajv.errorsText(validate.errors)).toBe(true);
    }
  });

  // After every test above (its root calls may change what later generated requests meet).
  it.each(methodIds.filter((id) => !(id in successValidatedElsewhere)))(
    '%s has validated a success (generating more requests while it has none)',
    async (operationId) => {
      if (succeededMethods.has(operationId)) return;
      const operation = operations().find((o) => o.operationId === operationId)!;
      const validBody = validatorAt(operation.bodyRef);
      const sampled = fc.sample(
        arbitraryFromSchema(withKnownValues(operation.bodySchema), { resolve }).filter((v) => validBody(v)),
        { numRuns: successSamples, seed },
      );
      const bodies = [...new Set(sampled.map((body) => JSON.stringify(body)))];
      const failures: string[] = [];
      for (let at = 0; at < bodies.length && !succeededMethods.has(operationId); at += successBatch) {
        await Promise.all(
          bodies.slice(at, at + successBatch).map(async (body) => {
            const answer = await send(operation.path, { token: w.root.token, body });
            const problem = checkAgainstDocument(operation.path, 'post', answer);
            if (problem) failures.push(`${operationId}: ${problem}`);
            if (answer.status === 200) succeededMethods.add(operationId);
          }),
        );
      }
      expect(failures).toEqual([]);
      expect(succeededMethods.has(operationId), `no request to ${operationId} succeeded`).toBe(true);
    },
    timeoutFor(successSamples),
  );
});
