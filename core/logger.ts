import pino, { type Logger } from 'pino';

export type { Logger };

/** How log lines are written: `pretty` for people, `json` for machines, `auto` by where stdout goes. */
export const logFormats = ['auto', 'pretty', 'json'] as const;
export type LogFormat = (typeof logFormats)[number];

/**
 * The root logger of a process. `format` decides how lines are written (default `json`): `auto` is
 * pretty on a terminal and JSON when stdout is piped or redirected. Children are bound to
 * requestId, reservationId or nodeId by callers.
 */
export function createLogger(options: { level?: string; name?: string; format?: LogFormat } = {}): Logger {
  const base = { level: options.level ?? 'info', name: options.name ?? 'better-compute' };
  const format = options.format ?? 'json';
  if (format === 'pretty' || (format === 'auto' && process.stdout.isTTY)) {
    return pino(
      base,
      pino.transport({
        target: 'pino-pretty',
        options: {
          colorize: Boolean(process.stdout.isTTY),
          singleLine: true,
          ignore: 'pid,hostname',
          translateTime: 'HH:MM:ss',
        },
      }),
    );
  }
  return pino(base);
}
