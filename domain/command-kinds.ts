import { z } from 'zod';
import type { CommandLane, NodeRole } from './fleet.ts';

/**
 * The registered command kinds: lane, the roles that accept them, a timeout, the payload schema and
 * their flags. Commands are actions; lasting state belongs in the NodeSpec.
 */
export interface CommandKind {
  lane: CommandLane;
  roles: readonly NodeRole[];
  timeoutMs: number;
  payload: z.ZodType<Record<string, unknown>>;
  /** Safe to run again after an interruption (the journal still never repeats a completed one). */
  retrySafe: boolean;
  destructive: boolean;
  summary: string;
}

const gpuRoles = ['node', 'node-tenant'] as const satisfies readonly NodeRole[];

export const commandKinds = {
  'node.reboot': {
    lane: 'control',
    roles: ['node', 'node-tenant', 'site'],
    timeoutMs: 10 * 60_000,
    payload: z.strictObject({ reason: z.string().max(500).optional() }),
    retrySafe: false,
    destructive: true,
    summary: 'Reboot the machine (simulated: the agent drops its session and reconnects).',
  },
  'gpu.reset': {
    lane: 'control',
    roles: gpuRoles,
    timeoutMs: 2 * 60_000,
    payload: z.strictObject({ gpuUuid: z.string().min(1).max(200) }),
    retrySafe: false,
    destructive: true,
    summary: 'Reset one GPU that no allocation holds.',
  },
  'inventory.refresh': {
    lane: 'control',
    roles: ['node', 'node-tenant', 'site', 'ramdisk'],
    timeoutMs: 60_000,
    payload: z.strictObject({}),
    retrySafe: true,
    destructive: false,
    summary: 'Re-read the hardware and send every inventory section again.',
  },
  'diag.nvml': {
    lane: 'bulk',
    roles: gpuRoles,
    timeoutMs: 5 * 60_000,
    payload: z.strictObject({ level: z.enum(['quick', 'full']).default('quick') }),
    retrySafe: true,
    destructive: false,
    summary: 'Run GPU diagnostics and return per-GPU results.',
  },
} as const satisfies Record<string, CommandKind>;

export type CommandKindName = keyof typeof commandKinds;
export const commandKindNames = Object.keys(commandKinds) as CommandKindName[];

export function isCommandKind(kind: string): kind is CommandKindName {
  return Object.hasOwn(commandKinds, kind);
}
