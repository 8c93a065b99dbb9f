import { applySpecPatch, canonicalJson, specPatch } from '../domain/node-spec.ts';
import type { NodeSpecUpdate } from '../proto/gen/agent/v1/agent.ts';

/**
 * What one session sent of its node's NodeSpec: the first update is whole, later ones patch the
 * top-level sections that changed since the generation the node has. Never sends a generation
 * twice or backwards.
 */
export class SpecSender {
  sentGeneration = 0;
  private sent: Record<string, unknown> | null = null;

  next(generation: number, spec: Record<string, unknown>): NodeSpecUpdate | null {
    if (generation <= this.sentGeneration) return null;
    let update: NodeSpecUpdate;
    if (this.sent) {
      const patch = specPatch(this.sent, spec);
      update = {
        generation,
        whole: false,
        specJson: Buffer.alloc(0),
        baseGeneration: this.sentGeneration,
        patchJson: Buffer.from(canonicalJson(patch)),
      };
      this.sent = applySpecPatch(this.sent, patch);
    } else {
      update = {
        generation,
        whole: true,
        specJson: Buffer.from(canonicalJson(spec)),
        baseGeneration: 0,
        patchJson: Buffer.alloc(0),
      };
      this.sent = spec;
    }
    this.sentGeneration = generation;
    return update;
  }

  /** The node could not apply a patch: the next update is whole. */
  reset(): void {
    this.sent = null;
    this.sentGeneration = 0;
  }
}
