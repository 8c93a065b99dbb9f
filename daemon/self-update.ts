import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import { isComputeError } from '../domain/errors.ts';
import type { BcdRollbackPayload, BcdUpdatePayload, BcdUpdateState } from '../domain/release-commands.ts';
import {
  checkNotDowngrade,
  checkReleaseFiles,
  checkReleaseNotExpired,
  type ReleaseTrust,
  releaseManifestSchema,
  releaseRefused,
  releaseSignatureSchema,
  verifyReleaseSignatures,
} from '../domain/release-manifest.ts';

/**
 * bcd's self-update with A/B slots. A "binary" is a versioned, content-addressed file set: an
 * update verifies the release itself (signatures against bcd's own pins and threshold, expiry, no
 * downgrade from what it runs, every file's size and SHA-256), writes the files into the inactive
 * slot, makes it active on trial and restarts into it (a new session, so a new epoch). On trial
 * the new version reports healthy or unhealthy; unhealthy, or a crash at start, sends bcd back to
 * its previous slot by itself, and it reports `rolled-back` with why on its next session. A trial
 * healthy for the soak is committed. The slot state survives restarts (`slots.json`).
 *
 * Only the simulator restarts into a slot (`bcd sim`): the version is what the agent declares, and
 * a release's optional `sim.json` file (`{"behaviour": "crash-at-start" | "unhealthy"}`) makes that
 * version misbehave. `bcd node` does not re-execute itself and refuses self-update.
 */

export type SlotName = 'a' | 'b';
export type SimBehaviour = 'healthy' | 'crash-at-start' | 'unhealthy';

export interface InstalledSlot {
  releaseId: string | null;
  version: string;
  protocolVersion: number;
  behaviour: SimBehaviour;
}

interface SlotsFile {
  active: SlotName;
  slots: Partial<Record<SlotName, InstalledSlot>>;
  trial: { slot: SlotName; previous: SlotName; releaseId: string; soakMs: number; started: boolean } | null;
  pendingReport: { releaseId: string; state: BcdUpdateState; message: string } | null;
}

export interface SelfUpdateOptions {
  stateDir: string;
  /** What the node runs before any update (slot a). */
  baseVersion: string;
  baseProtocolVersion: number;
  /** The pinned release signers; null refuses every update. */
  trust: ReleaseTrust | null;
  log: Logger;
  /** A behaviour forced per version (the simulator's faults), over the release's sim.json. */
  behaviourOf?: (version: string) => SimBehaviour | undefined;
  /** The clock for expiry checks (tests move it). */
  nowMs?: () => number;
}

export type SendUpdateStatus = (status: {
  releaseId: string;
  version: string;
  state: BcdUpdateState;
  message: string;
}) => void;

const other = (slot: SlotName): SlotName => (slot === 'a' ? 'b' : 'a');

export class SelfUpdater {
  private state: SlotsFile;
  private readonly file: string;
  private commitTimer: NodeJS.Timeout | null = null;

  constructor(private readonly options: SelfUpdateOptions) {
    this.file = path.join(options.stateDir, 'slots.json');
    this.state = this.load();
  }

  private load(): SlotsFile {
    try {
      return JSON.parse(readFileSync(this.file, 'utf8')) as SlotsFile;
    } catch {
      return {
        active: 'a',
        slots: {
          a: {
            releaseId: null,
            version: this.options.baseVersion,
            protocolVersion: this.options.baseProtocolVersion,
            behaviour: 'healthy',
          },
        },
        trial: null,
        pendingReport: null,
      };
    }
  }

  private persist(): void {
    mkdirSync(this.options.stateDir, { recursive: true });
    writeFileSync(`${this.file}.tmp`, JSON.stringify(this.state));
    renameSync(`${this.file}.tmp`, this.file);
  }

  /** The slot bcd runs now. */
  current(): InstalledSlot {
    return this.state.slots[this.state.active]!;
  }

  private behaviour(slot: InstalledSlot): SimBehaviour {
    return this.options.behaviourOf?.(slot.version) ?? slot.behaviour;
  }

  /** Goes back to the previous slot, to report `message` as rolled-back on the next session. */
  private fallBack(message: string): void {
    const trial = this.state.trial;
    const leaving = this.current();
    const back = trial?.previous ?? other(this.state.active);
    this.state.active = back;
    this.state.trial = null;
    this.state.pendingReport = {
      releaseId: trial?.releaseId ?? leaving.releaseId ?? '',
      state: 'rolled-back',
      message,
    };
    this.persist();
    this.options.log.warn({ from: leaving.version, to: this.current().version, message }, 'bcd rolled back');
  }

  /**
   * Called before each session: the first start of a slot on trial. A version that crashes at
   * start never opens a session: bcd falls back to the previous slot at once.
   */
  beforeSession(): void {
    const trial = this.state.trial;
    if (!trial || trial.started) return;
    const slot = this.state.slots[trial.slot]!;
    if (this.behaviour(slot) === 'crash-at-start') {
      this.fallBack(`${slot.version} crashed at start; back on ${this.state.slots[trial.previous]!.version}`);
      return;
    }
    trial.started = true;
    this.persist();
  }

  /**
   * Called once a session is welcomed: sends the pending rolled-back report, and on trial the new
   * version's health (unhealthy: back to the previous slot through `restart`; healthy: committed
   * once the soak passed).
   */
  afterWelcome(send: SendUpdateStatus, restart: () => void): void {
    if (this.commitTimer) clearTimeout(this.commitTimer);
    const slot = this.current();
    const pending = this.state.pendingReport;
    if (pending) {
      send({ ...pending, version: slot.version });
      this.state.pendingReport = null;
      this.persist();
    }
    const trial = this.state.trial;
    if (!trial) return;
    if (this.behaviour(slot) === 'unhealthy') {
      send({
        releaseId: trial.releaseId,
        version: slot.version,
        state: 'unhealthy',
        message: 'health check failed',
      });
      setTimeout(() => {
        if (this.state.trial !== trial) return;
        this.fallBack(
          `${slot.version} reported unhealthy; back on ${this.state.slots[trial.previous]!.version}`,
        );
        restart();
      }, 200);
      return;
    }
    send({ releaseId: trial.releaseId, version: slot.version, state: 'healthy', message: '' });
    this.commitTimer = setTimeout(() => {
      if (this.state.trial !== trial) return;
      this.state.trial = null;
      this.persist();
      send({ releaseId: trial.releaseId, version: slot.version, state: 'committed', message: '' });
    }, trial.soakMs);
    this.commitTimer.unref();
  }

  /**
   * `bcd.update`: verifies the release against this bcd's own trust, stages it in the inactive
   * slot and makes it active on trial; the caller restarts. Throws with the refusal's reason.
   */
  stage(payload: BcdUpdatePayload): { staged: string; slot: SlotName; from: string } {
    const refuse = (error: unknown): never => {
      const reason = isComputeError(error)
        ? `${String(error.details?.refusal ?? error.code)}: ${error.message}`
        : String(error);
      throw new Error(`release refused by bcd (${reason})`);
    };
    if (this.state.trial)
      throw new Error('an update is already on trial: wait for it to commit or roll back');
    const from = this.current();
    try {
      const parsed = releaseManifestSchema.safeParse(payload.manifest);
      if (!parsed.success)
        throw releaseRefused(
          'bad-signature',
          `the manifest is malformed: ${parsed.error.issues[0]?.message}`,
        );
      const manifest = parsed.data;
      const signatures = releaseSignatureSchema.array().safeParse(payload.signatures);
      if (!signatures.success) throw releaseRefused('bad-signature', 'the signatures are malformed');
      if (!this.options.trust) throw releaseRefused('no-trust', 'this bcd has no pinned release signers');
      verifyReleaseSignatures(manifest, signatures.data, this.options.trust);
      checkReleaseNotExpired(manifest, this.options.nowMs?.() ?? Date.now());
      checkNotDowngrade(manifest, from.version, 'the version this bcd runs');
      const files = new Map(payload.files.map((f) => [f.path, Buffer.from(f.content, 'base64')]));
      checkReleaseFiles(manifest, files);
      const slot = other(this.state.active);
      const dir = path.join(this.options.stateDir, 'slots', slot);
      rmSync(dir, { recursive: true, force: true });
      for (const [name, content] of files) {
        mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
        writeFileSync(path.join(dir, name), content);
      }
      let behaviour: SimBehaviour = 'healthy';
      const sim = files.get('sim.json');
      if (sim) {
        const declared = (JSON.parse(sim.toString('utf8')) as { behaviour?: string }).behaviour;
        if (declared === 'crash-at-start' || declared === 'unhealthy') behaviour = declared;
      }
      this.state.slots[slot] = {
        releaseId: payload.releaseId,
        version: manifest.version,
        protocolVersion: manifest.protocolVersion,
        behaviour,
      };
      this.state.trial = {
        slot,
        previous: this.state.active,
        releaseId: payload.releaseId,
        soakMs: payload.soakMs,
        started: false,
      };
      this.state.active = slot;
      this.persist();
      this.options.log.info(
        { from: from.version, to: manifest.version, slot },
        'release staged; restarting into it',
      );
      return { staged: manifest.version, slot, from: from.version };
    } catch (error) {
      return refuse(error);
    }
  }

  /** `bcd.rollback`: back to the previous slot (which must hold `toVersion` when given). */
  rollback(payload: BcdRollbackPayload): { rolledBackTo: string; from: string } {
    const from = this.current();
    const previous = this.state.slots[other(this.state.active)];
    if (!previous) throw new Error('no previous slot to roll back to');
    if (payload.toVersion && previous.version !== payload.toVersion) {
      throw new Error(`the previous slot holds ${previous.version}, not ${payload.toVersion}`);
    }
    if (this.commitTimer) clearTimeout(this.commitTimer);
    this.state.trial = null;
    this.state.active = other(this.state.active);
    this.state.pendingReport = {
      releaseId: from.releaseId ?? '',
      state: 'rolled-back',
      message: payload.reason ?? 'rolled back on request',
    };
    this.persist();
    return { rolledBackTo: previous.version, from: from.version };
  }

  stop(): void {
    if (this.commitTimer) clearTimeout(this.commitTimer);
  }
}
