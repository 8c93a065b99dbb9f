import pino, { type Logger } from 'pino';

export type { Logger };

/**
 * The root logger of a process. Structured JSON by default; `pretty` renders for people (the dev
 * stack on a terminal). Children are bound to requestId, reservationId or nodeId by callers.
 */
export function createLogger(options: { level?: string; name?: string; pretty?: boolean } = {}): Logger {
  const base = { level: options.level ?? 'info', name: options.name ?? 'better-compute' };
  if (options.pretty) {
    return pino(
      base,
      pino.transport({
        target: 'pino-pretty',
        options: { colorize: true, ignore: 'pid,hostname', translateTime: 'HH:MM:ss' },
      }),
    );
  }
  return pino(base);
}
