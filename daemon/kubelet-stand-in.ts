import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import {
  type ClientReadableStream,
  credentials,
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type sendUnaryData,
  status,
} from '@grpc/grpc-js';
import {
  type AllocateResponse,
  type Device,
  DevicePluginClient,
  type Empty,
  type ListAndWatchResponse,
  type RegisterRequest,
  RegistrationService,
} from '../proto/gen/deviceplugin/v1beta1/api.ts';
import { devicePluginApiVersion, kubeletSocketName } from './device-plugin.ts';
import { writeKubeletCheckpoint } from './kubelet-checkpoint.ts';

interface Plugin {
  request: RegisterRequest;
  client: DevicePluginClient;
  stream: ClientReadableStream<ListAndWatchResponse>;
  devices: Device[];
}

/**
 * A kubelet's device manager in miniature, speaking the device plugin API v1beta1 over unix
 * sockets like the real one: serves Registration on `<dir>/kubelet.sock`, dials each registered
 * plugin's endpoint and keeps its ListAndWatch stream, and admits pods by asking the plugin for a
 * preferred allocation among the healthy devices not yet given to a pod, then calling Allocate.
 * A restart clears the directory's sockets first, as the kubelet does. `bcd sim` runs one per node;
 * tests drive it, and call the plugins directly through `client()`.
 */
export class KubeletStandIn {
  private server: Server | null = null;
  private readonly plugins = new Map<string, Plugin>();
  /** Devices given to pods: pod name to resource name and device ids. */
  readonly pods = new Map<
    string,
    { resourceName: string; deviceIds: string[]; response: AllocateResponse }
  >();
  /** Every Register the kubelet accepted, in order. */
  readonly registrations: RegisterRequest[] = [];

  constructor(readonly dir: string) {}

  async start(): Promise<void> {
    mkdirSync(this.dir, { recursive: true });
    // A starting kubelet removes every socket in its device-plugin directory: plugins register again.
    for (const name of readdirSync(this.dir)) {
      if (name.endsWith('.sock')) rmSync(path.join(this.dir, name), { force: true });
    }
    const server = new Server();
    server.addService(RegistrationService, {
      register: (call: ServerUnaryCall<RegisterRequest, Empty>, done: sendUnaryData<Empty>) => {
        if (call.request.version !== devicePluginApiVersion) {
          done({ code: status.INVALID_ARGUMENT, details: `unsupported version ${call.request.version}` });
          return;
        }
        this.connect(call.request);
        this.registrations.push(call.request);
        this.checkpoint();
        done(null, {});
      },
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(
        `unix://${path.join(this.dir, kubeletSocketName)}`,
        ServerCredentials.createInsecure(),
        (err) => (err ? reject(err) : resolve()),
      ),
    );
    this.server = server;
  }

  async stop(): Promise<void> {
    for (const plugin of this.plugins.values()) this.disconnect(plugin);
    this.plugins.clear();
    this.server?.forceShutdown();
    this.server = null;
    rmSync(path.join(this.dir, kubeletSocketName), { force: true });
  }

  /** Stops and starts again with a new kubelet.sock (pods keep their devices, as on a real node). */
  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** The resource names with a plugin connected. */
  resourceNames(): string[] {
    return [...this.plugins.keys()].sort();
  }

  /** The list the plugin last sent for `resourceName` ([] before any). */
  devices(resourceName: string): Device[] {
    return this.plugins.get(resourceName)?.devices ?? [];
  }

  /** A client of the plugin registered for `resourceName`, for calls the kubelet would make. */
  client(resourceName: string): DevicePluginClient {
    const plugin = this.plugins.get(resourceName);
    if (!plugin) throw new Error(`no device plugin registered ${resourceName}`);
    return plugin.client;
  }

  /**
   * Admits a pod asking for `count` of `resourceName`: the plugin picks among the healthy devices
   * no other pod holds (GetPreferredAllocation), then Allocate answers what the container gets.
   */
  async admit(pod: string, resourceName: string, count: number): Promise<AllocateResponse> {
    const client = this.client(resourceName);
    const taken = new Set([...this.pods.values()].flatMap((p) => p.deviceIds));
    const available = this.devices(resourceName)
      .filter((d) => d.health === 'Healthy' && !taken.has(d.ID))
      .map((d) => d.ID);
    if (available.length < count) {
      throw new Error(`${resourceName}: ${count} wanted, ${available.length} allocatable`);
    }
    const preferred = await new Promise<string[]>((resolve, reject) =>
      client.getPreferredAllocation(
        {
          containerRequests: [
            { availableDeviceIDs: available, mustIncludeDeviceIDs: [], allocationSize: count },
          ],
        },
        (err, res) => (err ? reject(err) : resolve(res.containerResponses[0]?.deviceIDs ?? [])),
      ),
    );
    const deviceIds = preferred.length === count ? preferred : available.slice(0, count);
    const response = await new Promise<AllocateResponse>((resolve, reject) =>
      client.allocate({ containerRequests: [{ devicesIds: deviceIds }] }, (err, res) =>
        err ? reject(err) : resolve(res),
      ),
    );
    this.pods.set(pod, { resourceName, deviceIds, response });
    this.checkpoint();
    return response;
  }

  /** The pod ended: its devices are free for the next one. */
  removePod(pod: string): void {
    this.pods.delete(pod);
    this.checkpoint();
  }

  /** What the kubelet keeps on disk: registered resources with their devices, and pods' devices. */
  private checkpoint(): void {
    writeKubeletCheckpoint(this.dir, {
      registeredDevices: Object.fromEntries(
        [...this.plugins.entries()].map(([name, p]) => [name, p.devices.map((d) => d.ID)]),
      ),
      podDeviceEntries: [...this.pods.entries()].map(([pod, p]) => ({
        podUid: pod,
        containerName: 'main',
        resourceName: p.resourceName,
        deviceIds: p.deviceIds,
      })),
    });
  }

  private connect(request: RegisterRequest): void {
    const previous = this.plugins.get(request.resourceName);
    if (previous) this.disconnect(previous);
    const client = new DevicePluginClient(
      `unix://${path.join(this.dir, request.endpoint)}`,
      credentials.createInsecure(),
    );
    const stream = client.listAndWatch({});
    const plugin: Plugin = { request, client, stream, devices: [] };
    stream.on('data', (list: ListAndWatchResponse) => {
      plugin.devices = list.devices;
      this.checkpoint();
    });
    // A plugin gone (its stream ended): its resource is no longer registered.
    stream.on('error', () => {
      if (this.plugins.get(request.resourceName) !== plugin) return;
      this.plugins.delete(request.resourceName);
      if (this.server) this.checkpoint();
    });
    this.plugins.set(request.resourceName, plugin);
  }

  private disconnect(plugin: Plugin): void {
    plugin.stream.cancel();
    plugin.client.close();
  }
}
