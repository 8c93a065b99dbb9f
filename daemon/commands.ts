import { type CommandKindName, commandKinds, isCommandKind } from '../domain/command-kinds.ts';
import { assertNever } from '../domain/errors.ts';
import { type Command, CommandOutcome, type CommandResult } from '../proto/gen/agent/v1/agent.ts';
import type { Hardware } from './hardware.ts';
import type { Journal } from './journal.ts';

/** What a command may do to the agent besides the hardware. */
export interface CommandHost {
  hardware: Hardware;
  journal: Journal;
  /** GPUs held by an allocation now (a reset of one is refused). */
  heldGpus(): Set<string>;
  resendInventory(): void;
  /** Simulated reboot: drop the session and come back. */
  reboot(): void;
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
    default:
      return assertNever(kind);
  }
}
