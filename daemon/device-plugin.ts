import { existsSync, mkdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import {
  credentials,
  Metadata,
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type ServerWritableStream,
  type sendUnaryData,
  status,
} from '@grpc/grpc-js';
import type { Logger } from '../core/logger.ts';
import type { GpuInventory } from '../domain/inventory-sections.ts';
import {
  type AllocateRequest,
  type AllocateResponse,
  type ContainerAllocateResponse,
  type DevicePluginOptions,
  type DevicePluginServer,
  DevicePluginService,
  type Empty,
  type ListAndWatchResponse,
  type PreferredAllocationRequest,
  type PreferredAllocationResponse,
  type PreStartContainerRequest,
  type PreStartContainerResponse,
  RegistrationClient,
} from '../proto/gen/deviceplugin/v1beta1/api.ts';
import {
  type AdvertisedAtom,
  advertisedAtoms,
  type KubernetesHold,
  type KubernetesResourceKind,
  kubernetesResourceKinds,
  kubernetesResourceNames,
  pluginSocketName,
  preferredAllocation,
} from './device-plugin-devices.ts';
import { foreignGpuResources, readKubeletCheckpoint } from './kubelet-checkpoint.ts';

/** The device plugin API version bcd speaks, as the kubelet names it. */
export const devicePluginApiVersion = 'v1beta1';
/** The kubelet's registration socket, inside the device-plugin directory. */
export const kubeletSocketName = 'kubelet.sock';

export interface DevicePluginOptionsInput {
  /** The kubelet's device-plugin directory (/var/lib/kubelet/device-plugins). */
  dir: string;
  log: Logger;
  /** The kubelet advertised an allocation's atoms for the first time (or lost them): bcd reports. */
  advertisedChanged?(): void;
  /** Another device plugin can hand this node's GPUs to pods now, or no longer can. */
  foreignChanged?(resources: readonly string[]): void;
  /** The pods holding bcd's devices changed (the kubelet's checkpoint says so). */
  podsChanged?(): void;
  /** How often kubelet.sock and the plugin's own sockets are checked (default 1 s). */
  watchIntervalMs?: number;
}

interface ResourceServer {
  kind: KubernetesResourceKind;
  server: Server;
  socket: string;
  streams: Set<ServerWritableStream<Empty, ListAndWatchResponse>>;
  /** The ids of the list last written to the open streams (empty when none is open). */
  sent: Set<string>;
  /** The kubelet.sock this resource is registered with (its inode and change time), or null. */
  registeredWith: string | null;
}

/**
 * bcd's Kubernetes device plugin (API v1beta1 over unix sockets): one DevicePlugin server per
 * resource name it serves, each registered with the kubelet at `<dir>/kubelet.sock`.
 * `ListAndWatch` streams exactly the atoms booked to the node's live `kubernetes`-bound holds
 * (healthy or not) and sends the list again whenever it changes; `Allocate` answers with the CDI
 * device names and env of booked atoms and refuses any other id; `GetPreferredAllocation` keeps a
 * pod's atoms on one NVLink domain. A new kubelet.sock (the kubelet restarted) or a removed plugin
 * socket (the kubelet clears the directory when it starts) makes it serve and register again.
 */
export class KubeletDevicePlugin {
  private readonly servers = new Map<KubernetesResourceKind, ResourceServer>();
  private atoms = new Map<KubernetesResourceKind, AdvertisedAtom[]>();
  private migCapable = false;
  private gpuIds = new Set<string>();
  private foreign: string[] = [];
  /** The pods' holdings of bcd's devices last read from the kubelet's checkpoint, as a key. */
  private podsKey = '';
  private timer: NodeJS.Timeout | null = null;
  private ticking = false;
  private stopped = false;
  /** Atoms handed to containers by Allocate since bcd started, by id. */
  readonly allocated = new Map<string, { allocationId: string; resourceName: string }>();

  constructor(private readonly options: DevicePluginOptionsInput) {}

  start(): void {
    this.stopped = false;
    this.timer = setInterval(() => void this.tick(), this.options.watchIntervalMs ?? 1_000);
    this.timer.unref();
    void this.tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await Promise.all([...this.servers.values()].map((s) => this.closeServer(s)));
    this.servers.clear();
  }

  /** The resource names served now. */
  resourceNames(): string[] {
    return [...this.servers.keys()].map((k) => kubernetesResourceNames[k]);
  }

  /**
   * The resource names besides bcd's through which the kubelet can hand GPUs to pods (its
   * checkpoint lists another plugin registered for them): the node reports ForeignGpuExposure.
   */
  foreignGpuResources(): string[] {
    return [...this.foreign];
  }

  /**
   * The pods that hold any of `stableIds`, as the kubelet's checkpoint lists them under bcd's
   * resource names. Without a readable checkpoint, what Allocate handed out since bcd started
   * counts as held (the kubelet never says when a pod lets go through the plugin API).
   */
  podsHolding(stableIds: readonly string[]): string[] {
    const ids = new Set(stableIds);
    const checkpoint = readKubeletCheckpoint(this.options.dir);
    if (!checkpoint) return stableIds.some((id) => this.allocated.has(id)) ? ['(allocated by bcd)'] : [];
    return [
      ...new Set(
        checkpoint.podDeviceEntries
          .filter((e) => e.resourceName.startsWith('bcd.dev/') && e.deviceIds.some((id) => ids.has(id)))
          .map((e) => e.podUid),
      ),
    ].sort();
  }

  /** Whether every atom of `hold` is in the list the kubelet was last sent (on an open stream). */
  advertised(hold: KubernetesHold): boolean {
    return hold.stableIds.every((id) =>
      [...this.servers.values()].some((s) => s.streams.size > 0 && s.sent.has(id)),
    );
  }

  /** The holds or the GPUs changed: recompute the lists and send the ones that differ. */
  update(holds: readonly KubernetesHold[], gpus: readonly GpuInventory[]): void {
    this.atoms = advertisedAtoms(holds, gpus);
    this.migCapable = gpus.some((g) => g.mig?.mode === 'enabled');
    this.gpuIds = new Set(gpus.flatMap((g) => [g.uuid, ...(g.mig?.instances ?? []).map((m) => m.uuid)]));
    let changed = false;
    for (const server of this.servers.values()) changed = this.send(server) || changed;
    if (changed) this.options.advertisedChanged?.();
    if (this.wantedKinds().some((k) => !this.servers.has(k))) void this.tick();
  }

  private wantedKinds(): KubernetesResourceKind[] {
    return kubernetesResourceKinds.filter(
      (k) =>
        k === 'gpu' ||
        this.servers.has(k) ||
        (this.atoms.get(k)?.length ?? 0) > 0 ||
        (k === 'mig' && this.migCapable),
    );
  }

  private listOf(kind: KubernetesResourceKind): ListAndWatchResponse {
    return {
      devices: (this.atoms.get(kind) ?? []).map((a) => ({
        ID: a.id,
        health: a.health,
        topology: a.numaNode === null ? undefined : { nodes: [{ ID: a.numaNode }] },
      })),
    };
  }

  /** Writes the current list to the open streams if it differs from the last; answers whether it did. */
  private send(server: ResourceServer): boolean {
    const list = this.listOf(server.kind);
    const key = JSON.stringify(list.devices);
    if (server.streams.size === 0) return false;
    let wrote = false;
    for (const stream of server.streams) {
      const last = (stream as unknown as { bcdLast?: string }).bcdLast;
      if (last === key) continue;
      (stream as unknown as { bcdLast?: string }).bcdLast = key;
      stream.write(list);
      wrote = true;
    }
    const before = [...server.sent].sort().join(',');
    server.sent = new Set(list.devices.map((d) => d.ID));
    return wrote || before !== [...server.sent].sort().join(',');
  }

  /** One watch pass: serve every wanted kind, notice a new kubelet, register what is not. */
  private async tick(): Promise<void> {
    if (this.ticking || this.stopped) return;
    this.ticking = true;
    try {
      for (const kind of this.wantedKinds()) {
        const current = this.servers.get(kind);
        if (current && existsSync(current.socket)) continue;
        // The kubelet removes every plugin socket when it starts: serve again on a fresh one.
        if (current) await this.closeServer(current);
        this.servers.set(kind, await this.serve(kind));
      }
      const checkpoint = readKubeletCheckpoint(this.options.dir);
      const foreign = foreignGpuResources(checkpoint, this.gpuIds);
      const podsKey = JSON.stringify(
        (checkpoint?.podDeviceEntries ?? []).filter((e) => e.resourceName.startsWith('bcd.dev/')),
      );
      if (podsKey !== this.podsKey) {
        this.podsKey = podsKey;
        this.options.podsChanged?.();
      }
      if (foreign.join(',') !== this.foreign.join(',')) {
        this.foreign = foreign;
        this.options.log.warn({ resources: foreign }, 'foreign GPU exposure changed');
        this.options.foreignChanged?.(foreign);
      }
      const kubelet = this.kubeletIdentity();
      for (const server of this.servers.values()) {
        if (!kubelet) {
          server.registeredWith = null;
          continue;
        }
        if (server.registeredWith === kubelet || this.stopped) continue;
        try {
          await this.register(server);
          server.registeredWith = kubelet;
          this.options.log.info(
            { resourceName: kubernetesResourceNames[server.kind], dir: this.options.dir },
            'registered with the kubelet',
          );
        } catch (err) {
          this.options.log.warn(
            { err, resourceName: kubernetesResourceNames[server.kind] },
            'kubelet registration failed; retrying',
          );
        }
      }
    } catch (err) {
      this.options.log.warn({ err }, 'device plugin pass failed');
    } finally {
      this.ticking = false;
    }
  }

  /** kubelet.sock's inode and change time: a different one is a restarted kubelet. */
  private kubeletIdentity(): string | null {
    try {
      const s = statSync(path.join(this.options.dir, kubeletSocketName));
      return s.isSocket() ? `${s.ino}:${s.ctimeMs}` : null;
    } catch {
      return null;
    }
  }

  private register(server: ResourceServer): Promise<void> {
    const client = new RegistrationClient(
      `unix://${path.join(this.options.dir, kubeletSocketName)}`,
      credentials.createInsecure(),
    );
    return new Promise<void>((resolve, reject) => {
      client.register(
        {
          version: devicePluginApiVersion,
          endpoint: path.basename(server.socket),
          resourceName: kubernetesResourceNames[server.kind],
          options: { preStartRequired: false, getPreferredAllocationAvailable: true },
        },
        new Metadata(),
        { deadline: Date.now() + 5_000 }, // wall time: an RPC deadline
        (err) => {
          client.close();
          if (err) reject(err);
          else resolve();
        },
      );
    });
  }

  private async serve(kind: KubernetesResourceKind): Promise<ResourceServer> {
    const socket = path.join(this.options.dir, pluginSocketName(kind));
    mkdirSync(this.options.dir, { recursive: true });
    rmSync(socket, { force: true });
    const server = new Server();
    const resource: ResourceServer = {
      kind,
      server,
      socket,
      streams: new Set(),
      sent: new Set(),
      registeredWith: null,
    };
    server.addService(DevicePluginService, this.handlers(resource));
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${socket}`, ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      ),
    );
    return resource;
  }

  private async closeServer(resource: ResourceServer): Promise<void> {
    for (const stream of resource.streams) stream.end();
    resource.streams.clear();
    resource.sent.clear();
    resource.server.forceShutdown();
    rmSync(resource.socket, { force: true });
  }

  private handlers(resource: ResourceServer): DevicePluginServer {
    const resourceName = kubernetesResourceNames[resource.kind];
    return {
      getDevicePluginOptions: (_call: ServerUnaryCall<Empty, DevicePluginOptions>, done) =>
        done(null, { preStartRequired: false, getPreferredAllocationAvailable: true }),
      listAndWatch: (stream: ServerWritableStream<Empty, ListAndWatchResponse>) => {
        resource.streams.add(stream);
        const forget = () => {
          if (!resource.streams.delete(stream)) return;
          if (resource.streams.size === 0) resource.sent.clear();
          this.options.advertisedChanged?.();
        };
        stream.on('cancelled', forget);
        stream.on('close', forget);
        stream.on('error', forget);
        if (this.send(resource)) this.options.advertisedChanged?.();
      },
      getPreferredAllocation: (
        call: ServerUnaryCall<PreferredAllocationRequest, PreferredAllocationResponse>,
        done: sendUnaryData<PreferredAllocationResponse>,
      ) => {
        const atoms = this.atoms.get(resource.kind) ?? [];
        done(null, {
          containerResponses: call.request.containerRequests.map((r) => ({
            deviceIDs: preferredAllocation(
              atoms,
              r.availableDeviceIDs,
              r.mustIncludeDeviceIDs,
              r.allocationSize,
            ),
          })),
        });
      },
      allocate: (
        call: ServerUnaryCall<AllocateRequest, AllocateResponse>,
        done: sendUnaryData<AllocateResponse>,
      ) => {
        const atoms = new Map((this.atoms.get(resource.kind) ?? []).map((a) => [a.id, a]));
        const responses: ContainerAllocateResponse[] = [];
        for (const request of call.request.containerRequests) {
          const unknown = request.devicesIds.filter((id) => !atoms.has(id));
          if (unknown.length > 0 || request.devicesIds.length === 0) {
            done({
              code: status.FAILED_PRECONDITION,
              details:
                request.devicesIds.length === 0
                  ? 'Allocate names no device'
                  : `${unknown.slice(0, 8).join(', ')} ${unknown.length === 1 ? 'is' : 'are'} not booked to a kubernetes binding on this node as ${resourceName}; request only the devices ListAndWatch advertises`,
            });
            return;
          }
          const chosen = request.devicesIds.map((id) => atoms.get(id)!);
          for (const atom of chosen)
            this.allocated.set(atom.id, { allocationId: atom.allocationId, resourceName });
          const visible = [...new Set(chosen.map((a) => a.visibleDevice))].join(',');
          responses.push({
            envs: {
              NVIDIA_VISIBLE_DEVICES: visible,
              BCD_ALLOCATION_ID: [...new Set(chosen.map((a) => a.allocationId))].join(','),
            },
            mounts: [],
            devices: [],
            annotations: {},
            cdiDevices: chosen.map((a) => ({ name: a.cdiDevice })),
          });
        }
        this.options.log.info({ resourceName, containers: responses.length }, 'allocated to a pod');
        done(null, { containerResponses: responses });
      },
      preStartContainer: (
        _call: ServerUnaryCall<PreStartContainerRequest, PreStartContainerResponse>,
        done: sendUnaryData<PreStartContainerResponse>,
      ) => done(null, {}),
    };
  }
}
