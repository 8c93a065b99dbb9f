import type { Logger } from '../core/logger.ts';
import { attestedReportPurpose, signAllocationReport } from '../domain/attestation.ts';
import { applySpecPatch, type DeviceAssignment, nodeSpecSchema } from '../domain/node-spec.ts';
import type {
  AgentMessage,
  AllocationReport,
  NodeSpecUpdate,
  SpecStatus,
} from '../proto/gen/agent/v1/agent.ts';
import { convergeDevices, type DeviceRoots, type HeldAllocation } from './devices.ts';
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
    },
  ) {
    this.generation = options.journal.convergedGeneration;
  }

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

  private converge(assignments: readonly DeviceAssignment[], generation: number): void {
    const { held, released } = convergeDevices(this.options.roots, assignments);
    this.held = new Map(held.map((h) => [h.allocationId, h]));
    for (const hold of held) {
      if (this.reported.get(hold.allocationId) === 'bound') continue;
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
      this.report(allocationId, generation, { $case: 'released', value: { reason: 'unassigned' } });
    }
  }

  private report(
    allocationId: string,
    generation: number,
    kind: NonNullable<AllocationReport['kind']>,
  ): void {
    const report: AllocationReport = {
      purpose: attestedReportPurpose,
      nodeId: this.options.identity.nodeId,
      allocationId,
      specGeneration: generation,
      atMs: Date.now(),
      kind,
    };
    this.reported.set(allocationId, kind.$case);
    this.options.send({
      body: { $case: 'report', value: signAllocationReport(report, this.options.identity.privateKeyPem) },
    });
  }
}
