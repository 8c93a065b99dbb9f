import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import path from 'node:path';
import type { Logger } from '../../core/logger.ts';
import { BootNetwork } from '../../daemon/boot-network.ts';
import { MetalMachines } from '../../daemon/metal-machines.ts';
import type { EmulatedSystem } from '../../daemon/redfish-emulator.ts';
import { signImage } from '../../domain/metal-images.ts';
import { generateReleaseSigningKey } from '../../domain/release-manifest.ts';
import type { GatewayOptions } from '../../gateway/options.ts';
import { createCompute } from '../../server/compute.ts';
import { createTemporalLifecycle } from '../../temporal/lifecycle.ts';
import { type ApiFixture, callApi, createApiFixture } from '../support/api.ts';
import { eventually } from '../support/eventually.ts';
import { emulatedSystems, type MetalSite, startMetalSite } from '../support/metal-site.ts';
import { smallH100Shape } from '../support/sim-shapes.ts';
import { startTestTemporal, type TestTemporal } from '../support/temporal.ts';

/**
 * The stack the provisioning workflows run on in the metal tests, nothing faked: the API,
 * PostgreSQL, the Temporal dev server with a worker, the gateway with mutual TLS, a site agent
 * driving the Redfish emulator of sushy-tools, simulated machines that follow the emulator's power
 * and boot device, and an HTTP server for a signed image.
 */
export interface MetalDeployHarness {
  api: ApiFixture;
  temporal: TestTemporal;
  compute: ReturnType<typeof createCompute>;
  site: MetalSite;
  machines: MetalMachines;
  systems: EmulatedSystem[];
  signer: ReturnType<typeof generateReleaseSigningKey>;
  image: {
    bytes: Buffer;
    sha256: string;
    url: string;
    base: string;
    /** The next this many requests answer 503. */
    failRequests: number;
    /** Requests the image server received. */
    requests: number;
    /** Holds every image answer until the function it answers is called. */
    stall(): () => void;
  };
  // biome-ignore lint/suspicious/noExplicitAny: the answers are read field by field by the tests
  answer(method: string, body: unknown): Promise<{ status: number; body: any }>;
  // biome-ignore lint/suspicious/noExplicitAny: idem
  call(method: string, body: unknown): Promise<any>;
  // biome-ignore lint/suspicious/noExplicitAny: idem
  workflow(workflowId: string): Promise<any>;
  // biome-ignore lint/suspicious/noExplicitAny: idem
  until(workflowId: string, test: (wf: any) => boolean, ms?: number): Promise<any>;
  /** Registers the signed image (once) and creates a profile of it; answers the profile's id. */
  signedProfile(name: string, spec?: Record<string, unknown>): Promise<string>;
  stop(): Promise<void>;
}

export async function startMetalDeployHarness(input: {
  dir: string;
  log: Logger;
  machines: number;
  name: string;
  gatewayOptions?: Partial<GatewayOptions>;
}): Promise<MetalDeployHarness> {
  const { dir, log } = input;
  const signer = generateReleaseSigningKey();
  const bytes = Buffer.from('a bootable raw disk image, simulated\n'.repeat(4096));
  let gate: Promise<void> | null = null;
  const image = {
    bytes,
    sha256: createHash('sha256').update(bytes).digest('hex'),
    url: '',
    base: '',
    failRequests: 0,
    requests: 0,
    stall() {
      let release = () => {};
      gate = new Promise<void>((resolve) => {
        release = () => {
          gate = null;
          resolve();
        };
      });
      return release;
    },
  };
  const imageServer: Server = createServer(async (request, response) => {
    image.requests++;
    if (gate) await gate;
    if (image.failRequests > 0) {
      image.failRequests--;
      response.writeHead(503).end('busy');
      return;
    }
    if (request.url === '/images/ubuntu.raw') response.writeHead(200).end(bytes);
    else response.writeHead(404).end();
  });
  await new Promise<void>((resolve) => imageServer.listen(0, '127.0.0.1', resolve));
  image.base = `http://127.0.0.1:${(imageServer.address() as { port: number }).port}`;
  image.url = `${image.base}/images/ubuntu.raw`;
  const stops: Array<() => Promise<void>> = [
    () => new Promise<void>((resolve) => imageServer.close(() => resolve())),
  ];
  const stop = async () => {
    for (const step of stops.reverse()) await step().catch(() => {});
  };
  try {
    const api = await createApiFixture({
      max: 30,
      env: {
        BETTER_COMPUTE_IMAGE_SIGNER_PINS: signer.pin,
        BETTER_COMPUTE_RATE_LIMIT_PER_TOKEN: '0',
        BETTER_COMPUTE_RATE_LIMIT_PER_TENANT: '0',
      },
    });
    stops.push(() => api.stop());
    const temporal = await startTestTemporal({
      name: input.name,
      db: api.database.db,
      log,
      iam: api.iam,
      timers: {},
    });
    stops.push(() => temporal.stop());
    const compute = createCompute({
      ...api.deps,
      temporal: temporal.client,
      config: { ...api.deps.config, BETTER_COMPUTE_TASK_QUEUE: temporal.taskQueue },
    });
    const answer = (p: string, body: unknown) => callApi(compute.app, api.root.token, p, body);
    const call = async (p: string, body: unknown) => {
      const a = await answer(p, body);
      if (a.status !== 200) throw new Error(`${p}: ${a.status} ${JSON.stringify(a.body)}`);
      return a.body.data;
    };
    const workflow = (workflowId: string) => call('workflows/get', { workflowId });
    // biome-ignore lint/suspicious/noExplicitAny: the workflow view as the API answers it
    const until = async (workflowId: string, test: (wf: any) => boolean, ms = 240_000) => {
      // biome-ignore lint/suspicious/noExplicitAny: idem
      let last: any;
      await eventually(async () => {
        last = await workflow(workflowId);
        return test(last);
      }, ms);
      return last;
    };
    const network = new BootNetwork();
    const systems = emulatedSystems(input.machines, input.name);
    const machines = new MetalMachines({
      dir: path.join(dir, 'machines'),
      log,
      network,
      systems,
      shape: smallH100Shape,
    });
    stops.push(() => machines.stop());
    const notifyUrl = await machines.listen();
    const site = await startMetalSite({
      db: api.database.db,
      config: api.deps.config,
      call,
      dir,
      log,
      machines: systems.length,
      name: input.name,
      notifyUrl,
      bootNetwork: network,
      inspect: true,
      lifecycle: createTemporalLifecycle(temporal.client, { taskQueue: temporal.taskQueue }),
      gatewayOptions: { leaseMs: 10_000, heartbeatIntervalMs: 500, ...input.gatewayOptions },
      onEmulator: async (_emulator, gateway) =>
        machines.attach({ address: gateway.address, caCertificatePem: gateway.caCertificatePem }),
    });
    // The site stops first, then the machines and the stack under them.
    stops.push(() => site.stop());
    let signedImageId: string | null = null;
    const signedProfile = async (name: string, spec: Record<string, unknown> = {}) => {
      if (!signedImageId) {
        const identity = { name: 'ubuntu', version: '24.04', format: 'raw' as const, sha256: image.sha256 };
        signedImageId = (
          await call('images/register', {
            ...identity,
            url: image.url,
            signature: signImage(identity, signer.privateKeyPem),
          })
        ).id as string;
      }
      const profile = await call('profiles/create', {
        name,
        spec: { imageId: signedImageId, stepTimeoutSeconds: 120, maxAttempts: 2, ...spec },
      });
      return profile.id as string;
    };
    return {
      api,
      temporal,
      compute,
      site,
      machines,
      systems,
      signer,
      image,
      answer,
      call,
      workflow,
      until,
      signedProfile,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
