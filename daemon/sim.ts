import { createHash } from 'node:crypto';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import type { ReleaseTrust } from '../domain/release-manifest.ts';
import { currentProtocolVersion } from '../domain/release-version.ts';
import { agentVersion, NodeAgent } from './agent.ts';
import type { CgroupDriver } from './cgroups.ts';
import { removeSimulatorCgroups, simulatorCgroups } from './cgroups-sim.ts';
import { defaultSimShape, SimHardware, type SimShape } from './hardware.ts';
import { identityExists, joinWithToken, loadIdentity } from './identity.ts';
import { KubeletStandIn } from './kubelet-stand-in.ts';
import { SelfUpdater, type SimBehaviour } from './self-update.ts';

/** The simulated bcd every node of a fleet starts as (slot a), and how its updates behave. */
export interface SimBcdOptions {
  version?: string;
  protocolVersion?: number;
  /** The release signers these nodes pin (none: every update is refused). */
  trust?: ReleaseTrust;
  /** Versions told to crash at start or report unhealthy (mutable while the fleet runs). */
  faults?: Map<string, SimBehaviour>;
}

export interface SimulatedNode {
  nodeId: string;
  name: string;
  dir: string;
  agent: NodeAgent;
  hardware: SimHardware;
  /** Where the node makes its holds' slices. */
  cgroups?: CgroupDriver;
  /** The node's device-plugin directory, when it serves `kubernetes` bindings. */
  kubeletDir?: string;
  /** The in-process kubelet its device plugin registers with (`kubelet: 'stand-in'`). */
  kubelet?: KubeletStandIn;
}

export interface SimulatedFleet {
  nodes: SimulatedNode[];
  stop(): Promise<void>;
}

/**
 * Where `bcd sim` keeps simulated node `index` under `rootDir`: its name, its state directory and
 * the seed of its fake hardware (stable for one root directory). Benchmarks that provision
 * identities themselves write them to `dir`.
 */
export function simulatedNodeLayout(
  rootDir: string,
  index: number,
  namePrefix = 'sim',
): { name: string; dir: string; hardwareSeed: string } {
  const rootTag = createHash('sha256').update(path.resolve(rootDir)).digest('hex').slice(0, 8);
  const name = `${namePrefix}-${String(index).padStart(4, '0')}`;
  return { name, dir: path.join(rootDir, name), hardwareSeed: `${namePrefix}-${rootTag}-${index}` };
}

/**
 * `bcd sim`: N real node agents on fake hardware in one process, each with its own key,
 * certificate, session, journal and state directory (`<rootDir>/<name>/`, CDI specs in `cdi/`, env
 * files in `allocations/`). A node whose directory already holds an identity starts with it; the
 * others join with `joinToken` (which must allow that many uses). Joins run a few at a time.
 */
export async function startSimulatedFleet(input: {
  gatewayAddress: string;
  /**
   * Several gateways (no load balancer in front): node i starts on the i-th address (round robin)
   * and fails over to the others. Without it every node uses `gatewayAddress`.
   */
  gatewayAddresses?: string[];
  caCertificatePem: string;
  joinToken: string;
  nodes: number;
  rootDir: string;
  log: Logger;
  shape?: Partial<SimShape>;
  namePrefix?: string;
  joinConcurrency?: number;
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** How fast agents start their sessions (default 250 a second). */
  startsPerSecond?: number;
  /** The simulated bcd "binary": its version, protocol, release pins and per-version faults. */
  bcd?: SimBcdOptions;
  /**
   * Serve `kubernetes` bindings: each node's device plugin in `<dir>/device-plugins`, registering
   * with an in-process kubelet stand-in (`stand-in`) or with whatever kubelet serves that
   * directory (`external`, a test playing the kubelet).
   */
  kubelet?: 'stand-in' | 'external';
  /** How often the device plugins look for their kubelet (default 1 s). */
  kubeletWatchIntervalMs?: number;
}): Promise<SimulatedFleet> {
  const shape = { ...defaultSimShape, ...input.shape };
  const prefix = input.namePrefix ?? 'sim';
  const nodes: SimulatedNode[] = new Array(input.nodes);
  let next = 0;
  let launched = 0;
  const startedAt = Date.now();
  const worker = async () => {
    while (next < input.nodes) {
      const index = next++;
      const { name, dir, hardwareSeed } = simulatedNodeLayout(input.rootDir, index, prefix);
      const hardware = new SimHardware(hardwareSeed, shape);
      const gateways = input.gatewayAddresses?.length ? input.gatewayAddresses : [input.gatewayAddress];
      const gateway = gateways[index % gateways.length]!;
      const identity = identityExists(dir)
        ? { ...loadIdentity(dir), gateway }
        : await joinWithToken({
            gateway,
            token: input.joinToken,
            caCertificatePem: input.caCertificatePem,
            dir,
            evidence: hardware.evidence(),
            requestedName: name,
            agentVersion: '0.1.0-sim',
            onRetry: (err, waitMs) =>
              input.log.info(
                { node: name, code: (err as { code?: number }).code, err: (err as Error).message, waitMs },
                'join failed, trying again',
              ),
          });
      const selfUpdate = new SelfUpdater({
        stateDir: dir,
        baseVersion: input.bcd?.version ?? agentVersion,
        baseProtocolVersion: input.bcd?.protocolVersion ?? currentProtocolVersion,
        trust: input.bcd?.trust ?? null,
        log: input.log.child({ nodeId: identity.nodeId, node: name, component: 'self-update' }),
        ...(input.bcd?.faults ? { behaviourOf: (v: string) => input.bcd?.faults?.get(v) } : {}),
      });
      const cgroups = simulatorCgroups(hardware, { dir, name });
      const kubeletDir = input.kubelet ? path.join(dir, 'device-plugins') : undefined;
      const kubelet = kubeletDir && input.kubelet === 'stand-in' ? new KubeletStandIn(kubeletDir) : undefined;
      await kubelet?.start();
      const agent = new NodeAgent({
        selfUpdate,
        identity,
        stateDir: dir,
        roots: { cdiDir: path.join(dir, 'cdi'), envDir: path.join(dir, 'allocations') },
        hardware,
        cgroups,
        log: input.log.child({ nodeId: identity.nodeId, node: name }),
        ...(gateways.length > 1 ? { gateways } : {}),
        ...(input.minBackoffMs !== undefined ? { minBackoffMs: input.minBackoffMs } : {}),
        ...(input.maxBackoffMs !== undefined ? { maxBackoffMs: input.maxBackoffMs } : {}),
        ...(kubeletDir
          ? {
              kubelet: {
                deviceDir: kubeletDir,
                ...(input.kubeletWatchIntervalMs ? { watchIntervalMs: input.kubeletWatchIntervalMs } : {}),
              },
            }
          : {}),
      });
      // A fleet powering on at once still spreads its TLS handshakes a little (a real herd does).
      const gap = 1000 / (input.startsPerSecond ?? 250);
      const wait = startedAt + launched++ * gap - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      agent.start();
      nodes[index] = {
        nodeId: identity.nodeId,
        name: identity.nodeName,
        dir,
        agent,
        hardware,
        cgroups,
        ...(kubeletDir ? { kubeletDir } : {}),
        ...(kubelet ? { kubelet } : {}),
      };
    }
  };
  const started: SimulatedNode[] = [];
  try {
    await Promise.all(Array.from({ length: Math.max(1, input.joinConcurrency ?? 4) }, worker));
  } catch (error) {
    await Promise.all(nodes.filter(Boolean).map((n) => n.agent.stop()));
    await Promise.all(nodes.filter(Boolean).map((n) => n.kubelet?.stop()));
    throw error;
  }
  started.push(...nodes);
  input.log.info({ nodes: started.length, gateway: input.gatewayAddress }, 'simulated fleet started');
  return {
    nodes: started,
    stop: async () => {
      await Promise.all(started.map((n) => n.agent.stop()));
      await Promise.all(started.map((n) => n.kubelet?.stop()));
      for (const n of started) if (n.cgroups) removeSimulatorCgroups(n.cgroups);
    },
  };
}
