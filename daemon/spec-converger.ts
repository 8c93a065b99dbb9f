import type { Logger } from '../core/logger.ts';
import { attestedReportPurpose, signAllocationReport } from '../domain/attestation.ts';
import {
  applySpecPatch,
  canonicalJson,
  type DeviceAssignment,
  type MigLayoutSettings,
  nodeSpecSchema,
} from '../domain/node-spec.ts';
import type {
  AgentMessage,
  AllocationReport,
  NodeSpecUpdate,
  SpecStatus,
} from '../proto/gen/agent/v1/agent.ts';
import type { CgroupDriver } from './cgroups.ts';
import { DrainingHolds } from './device-plugin-draining.ts';
import { convergeDevices, type DeviceRoots, type HeldAllocation, sweepSlices } from './devices.ts';
import type { Hardware } from './hardware.ts';
import type { NodeIdentity } from './identity.ts';
import type { Journal } from './journal.ts';

/**
 * The daemon's side of the NodeSpec: applies whole specs and patches, refuses a generation older
 * than the one it converged (kept in the journal across restarts), converges the `devices`
 * section to CDI specs and env files, and reports each hold bound (once per session) and each
 * removed hold released, as attested reports signed with the node key.
 */
export class SpecConverger {
  generation: number;
  private spec: Record<string, unknown> | null = null;
  private held = new Map<string, HeldAllocation>();
  private reported = new Map<string, string>();

  constructor(
    private readonly options: {
      roots: DeviceRoots;
      journal: Journal;
      identity: NodeIdentity;
      log: Logger;
      send(message: AgentMessage): void;
      /** What the holds are checked against (atoms present and healthy, host memory). */
      hardware?: Hardware;
      /** Where slices are made; without it limits travel in the env file only. */
      cgroups?: CgroupDriver | null;
      /** The GPUs changed (a MIG layout was applied): send the inventory before the status. */
      inventoryChanged?(): void;
      /**
       * Whether a `kubernetes`-bound hold is bound yet: its atoms reached the kubelet (the device
       * plugin advertised them). Without it such a hold is bound once its files are written.
       */
      kubernetesAdvertised?(hold: HeldAllocation): boolean;
      /** Called after every converge with what is held now (the device plugin's lists follow it). */
      holdsChanged?(held: readonly HeldAllocation[]): void;
      /**
       * The pods holding any of these atoms (the device plugin reads the kubelet's checkpoint). With
       * it, a withdrawn `kubernetes` hold is reported released only once no pod holds its atoms.
       */
      kubernetesPodsHolding?(stableIds: readonly string[]): string[];
    },
  ) {
    this.generation = options.journal.convergedGeneration;
    this.draining = options.kubernetesPodsHolding ? new DrainingHolds(options.roots.envDir) : null;
  }

  private readonly draining: DrainingHolds | null;

  /** A new session: the next spec arrives whole and every hold is reported again. */
  newSession(): void {
    this.spec = null;
    this.reported.clear();
  }

  heldGpus(): Set<string> {
    return new Set([...this.held.values()].flatMap((h) => h.gpuUuids));
  }

  heldAllocations(): HeldAllocation[] {
    return [...this.held.values()];
  }

  /** Applies an update and answers the status to send. */
  onSpec(update: NodeSpecUpdate): SpecStatus {
    const generation = Number(update.generation);
    const { log, journal } = this.options;
    if (generation < journal.convergedGeneration || generation < this.generation) {
      log.warn({ generation, converged: this.generation }, 'refusing a NodeSpec older than converged');
      return { observedGeneration: this.generation, error: `stale generation ${generation}` };
    }
    try {
      let next: Record<string, unknown>;
      if (update.whole) {
        next = JSON.parse(update.specJson.toString('utf8'));
      } else {
        if (!this.spec || Number(update.baseGeneration) !== this.generation) {
          return { observedGeneration: this.generation, error: 'base-mismatch' };
        }
        next = applySpecPatch(this.spec, JSON.parse(update.patchJson.toString('utf8')));
      }
      const parsed = nodeSpecSchema.parse(next);
      const layout = parsed.host?.units.find((u) => u.unit === 'mig-layout');
      if (layout) this.convergeMigLayout(layout.settings);
      this.converge(parsed.devices, generation);
      this.spec = next;
      this.generation = generation;
      void journal.converged(generation).catch((err: unknown) => log.warn({ err }, 'journal write failed'));
      return { observedGeneration: generation, error: '' };
    } catch (err) {
      log.warn({ err, generation }, 'could not converge NodeSpec');
      return {
        observedGeneration: this.generation,
        error: `converge failed: ${(err as Error).message.slice(0, 200)}`,
      };
    }
  }

  /**
   * The host converger's `mig-layout` unit: applies the layout when the GPUs differ from it, then
   * the inventory goes out again, before the spec's status, so the control plane learns the new
   * instances before it learns this generation converged.
   */
  private convergeMigLayout(settings: MigLayoutSettings): void {
    const hardware = this.options.hardware;
    if (!hardware?.applyMigLayout) throw new Error('this node cannot apply a mig-layout');
    const current = hardware.gpus().gpus;
    const differs = settings.gpus.some((want) => {
      const gpu = current.find((g) => g.uuid === want.uuid);
      if (!gpu) throw new Error(`mig-layout names GPU ${want.uuid}, which this node does not have`);
      const have = gpu.mig?.mode === 'enabled' ? gpu.mig.instances.map((i) => i.profile) : null;
      return canonicalJson(have) !== canonicalJson(want.profiles);
    });
    if (!differs) return;
    hardware.applyMigLayout(settings);
    this.options.log.info({ gpus: settings.gpus.length }, 'mig-layout applied');
    this.options.inventoryChanged?.();
  }

  /** One pass without a new spec: re-checks the holds against the hardware and sweeps empty slices. */
  pass(): void {
    if (!this.spec) {
      if (this.options.cgroups) sweepSlices(this.options.cgroups, new Set(this.held.keys()));
      return;
    }
    try {
      this.converge(nodeSpecSchema.parse(this.spec).devices, this.generation);
    } catch (err) {
      this.options.log.warn({ err }, 'converge pass failed');
    }
  }

  private converge(assignments: readonly DeviceAssignment[], generation: number): void {
    const hardware = this.options.hardware;
    const before = this.held;
    const { held, released, failed } = convergeDevices(this.options.roots, assignments, {
      ...(hardware
        ? { gpus: hardware.gpus().gpus, hostMemoryBytes: hardware.host().memoryGiB * 1024 ** 3 }
        : {}),
      cgroups: this.options.cgroups ?? null,
    });
    this.held = new Map(held.map((h) => [h.allocationId, h]));
    this.options.holdsChanged?.(held);
    const failing = new Set(failed.map((f) => f.allocationId));
    // A hold refused for its devices: the control plane must learn their health too, or it would
    // place the reservation on them again.
    if (
      failed.some(
        (f) =>
          f.reason === 'device-unavailable' &&
          this.reported.get(f.allocationId) !== `failed:${f.reason}:${f.message}`,
      )
    ) {
      this.options.inventoryChanged?.();
    }
    for (const failure of failed) {
      const key = `failed:${failure.reason}:${failure.message}`;
      if (this.reported.get(failure.allocationId) === key) continue;
      this.report(
        failure.allocationId,
        generation,
        { $case: 'failed', value: { reason: failure.reason, message: failure.message } },
        key,
      );
    }
    for (const hold of held) {
      if (failing.has(hold.allocationId)) continue;
      if (this.reported.get(hold.allocationId) === 'bound') continue;
      const { kubernetesAdvertised } = this.options;
      if (hold.binding === 'kubernetes' && kubernetesAdvertised && !kubernetesAdvertised(hold)) continue;
      this.report(hold.allocationId, generation, {
        $case: 'bound',
        value: {
          cdiDevices: hold.cdiDevices,
          envFile: hold.envFile,
          cdiSpecFile: hold.cdiSpecFile,
          cgroupParent: hold.cgroupParent,
          gpuUuids: hold.gpuUuids,
        },
      });
    }
    for (const allocationId of released) {
      const kubernetes = before.get(allocationId);
      if (kubernetes?.binding === 'kubernetes' && this.draining) {
        // Pods the kubelet gave its atoms to keep running: released once they are gone (drainHolds).
        this.draining.add({ allocationId, stableIds: kubernetes.gpuUuids });
        continue;
      }
      this.report(allocationId, generation, { $case: 'released', value: { reason: 'unassigned' } });
    }
    this.drainHolds(new Set(assignments.map((a) => a.allocationId)), generation);
  }

  /**
   * Reports each draining `kubernetes` hold released once no pod holds any of its atoms (a hold
   * assigned again is no longer draining).
   */
  private drainHolds(assigned: ReadonlySet<string>, generation: number): void {
    const podsHolding = this.options.kubernetesPodsHolding;
    if (!this.draining || !podsHolding) return;
    for (const hold of this.draining.list()) {
      if (!assigned.has(hold.allocationId) && podsHolding(hold.stableIds).length > 0) continue;
      this.draining.remove(hold.allocationId);
      if (assigned.has(hold.allocationId)) continue;
      this.report(hold.allocationId, generation, { $case: 'released', value: { reason: 'pods-gone' } });
    }
  }

  private report(
    allocationId: string,
    generation: number,
    kind: NonNullable<AllocationReport['kind']>,
    key: string = kind.$case,
  ): void {
    const report: AllocationReport = {
      purpose: attestedReportPurpose,
      nodeId: this.options.identity.nodeId,
      allocationId,
      specGeneration: generation,
      atMs: Date.now(),
      kind,
    };
    this.reported.set(allocationId, key);
    this.options.send({
      body: { $case: 'report', value: signAllocationReport(report, this.options.identity.privateKeyPem) },
    });
  }
}
