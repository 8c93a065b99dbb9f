import { createLogger, type Logger } from '../../core/logger.ts';

/** A test's logger: silent unless LOG_LEVEL asks for more (or the test names its own level). */
export function testLogger(name = 'test', level = process.env.LOG_LEVEL ?? 'silent'): Logger {
  return createLogger({ level, name });
}
