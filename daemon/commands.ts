import { type CommandKindName, commandKinds, isCommandKind } from '../domain/command-kinds.ts';
import { assertNever } from '../domain/errors.ts';
import type { BcdRollbackPayload, BcdUpdatePayload } from '../domain/release-commands.ts';
import { type Command, CommandOutcome, type CommandResult } from '../proto/gen/agent/v1/agent.ts';
import type { Hardware } from './hardware.ts';
import type { Journal } from './journal.ts';
import type { SiteCommandKind } from './site-commands.ts';

/** The commissioning kinds a ramdisk runs (daemon/metal-machines.ts). */
export type RamdiskCommandKind = 'disk.wipe' | 'deploy.image' | 'boot.kexec' | 'logs.collect';

/** What a command may do to the agent besides the hardware. */
export interface CommandHost {
  hardware: Hardware;
  journal: Journal;
  /** GPUs held by an allocation now (a reset of one is refused). */
  heldGpus(): Set<string>;
  resendInventory(): void;
  /** Simulated reboot: drop the session and come back. */
  reboot(): void;
  /** A site agent's runner of `bmc.*` commands (Redfish); absent on a node, which refuses them. */
  siteCommands?: (kind: SiteCommandKind, payload: Record<string, unknown>) => Promise<unknown>;
  /** A ramdisk's runner of the commissioning kinds; absent elsewhere, which refuses them. */
  ramdiskCommands?: (kind: RamdiskCommandKind, payload: Record<string, unknown>) => Promise<unknown>;
  /** Self-update (A/B slots); absent on a bcd that does not re-execute itself. */
  selfUpdate?: {
    stage(payload: BcdUpdatePayload): unknown;
    rollback(payload: BcdRollbackPayload): unknown;
  };
}

function result(command: Command, outcome: CommandOutcome, body?: unknown, error?: string): CommandResult {
  return {
    commandId: command.id,
    seq: command.seq,
    outcome,
    resultJson: Buffer.from(body === undefined ? '' : JSON.stringify(body)),
    error: error ?? '',
  };
}

/**
 * Runs one command under the journal: a command already done answers its journaled result again
 * without running; one started before a restart answers INTERRUPTED unless its kind is retry-safe;
 * one past its not_after answers EXPIRED; an unknown kind or bad payload answers REJECTED.
 */
export async function runCommand(host: CommandHost, command: Command, nowMs: number): Promise<CommandResult> {
  const { journal } = host;
  const seen = journal.entry(command.id);
  if (seen?.state === 'done') {
    return {
      commandId: command.id,
      seq: command.seq,
      outcome: seen.outcome ?? CommandOutcome.COMMAND_OUTCOME_FAILED,
      resultJson: Buffer.from(seen.result ?? ''),
      error: seen.error ?? '',
    };
  }
  const finish = async (r: CommandResult): Promise<CommandResult> => {
    await journal.finish(
      command.id,
      command.seq,
      command.kind,
      r.outcome,
      r.resultJson.toString('utf8'),
      r.error,
    );
    return r;
  };
  if (!isCommandKind(command.kind)) {
    return finish(
      result(command, CommandOutcome.COMMAND_OUTCOME_REJECTED, undefined, `unknown kind ${command.kind}`),
    );
  }
  const kind = commandKinds[command.kind];
  if (seen?.state === 'started' && !kind.retrySafe) {
    return finish(
      result(
        command,
        CommandOutcome.COMMAND_OUTCOME_INTERRUPTED,
        undefined,
        'started before a restart; not run again',
      ),
    );
  }
  if (command.notAfterMs > 0 && nowMs > command.notAfterMs) {
    return finish(result(command, CommandOutcome.COMMAND_OUTCOME_EXPIRED, undefined, 'past not_after'));
  }
  let payload: unknown;
  try {
    payload = kind.payload.parse(JSON.parse(command.payloadJson.toString('utf8') || '{}'));
  } catch {
    return finish(result(command, CommandOutcome.COMMAND_OUTCOME_REJECTED, undefined, 'bad payload'));
  }
  // A retry-safe kind may run again after a crash, so only side effects wait for a durable start.
  if (!kind.retrySafe) await journal.start(command.id, command.seq, command.kind);
  try {
    const body = await execute(host, command.kind, payload as Record<string, unknown>);
    return finish(result(command, CommandOutcome.COMMAND_OUTCOME_SUCCEEDED, body));
  } catch (error) {
    return finish(
      result(
        command,
        CommandOutcome.COMMAND_OUTCOME_FAILED,
        undefined,
        (error as Error).message.slice(0, 500),
      ),
    );
  }
}

async function execute(
  host: CommandHost,
  kind: CommandKindName,
  payload: Record<string, unknown>,
): Promise<unknown> {
  switch (kind) {
    case 'gpu.reset': {
      const uuid = String(payload.gpuUuid);
      if (!host.hardware.gpus().gpus.some((g) => g.uuid === uuid)) throw new Error(`no GPU ${uuid}`);
      if (host.heldGpus().has(uuid)) throw new Error(`GPU ${uuid} is held by an allocation`);
      await host.hardware.resetGpu(uuid);
      return { reset: uuid };
    }
    case 'inventory.refresh':
      await host.hardware.refresh?.();
      host.resendInventory();
      return { sections: ['gpus', 'host'] };
    case 'diag.nvml':
      return { level: payload.level, gpus: await host.hardware.diagnose(String(payload.level)) };
    case 'node.reboot':
      setTimeout(() => host.reboot(), 50);
      return { rebooting: true };
    case 'bmc.power':
    case 'bmc.boot':
    case 'bmc.media':
    case 'bmc.inventory':
      if (!host.siteCommands) throw new Error(`${kind} runs on a site agent (bcd site) only`);
      return host.siteCommands(kind, payload);
    case 'disk.wipe':
    case 'deploy.image':
    case 'boot.kexec':
    case 'logs.collect':
      if (!host.ramdiskCommands) throw new Error(`${kind} runs in a ramdisk only`);
      return host.ramdiskCommands(kind, payload);
    case 'bcd.update':
    case 'bcd.rollback': {
      if (!host.selfUpdate) {
        throw new Error('self-update is not available on this bcd: only bcd sim restarts into a new slot');
      }
      const body =
        kind === 'bcd.update'
          ? host.selfUpdate.stage(payload as BcdUpdatePayload)
          : host.selfUpdate.rollback(payload as BcdRollbackPayload);
      // Restart into the slot once the answer is on its way (a new session, so a new epoch).
      setTimeout(() => host.reboot(), 50);
      return body;
    }
    default:
      return assertNever(kind);
  }
}
