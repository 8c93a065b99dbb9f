import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from '../core/logger.ts';
import { deploymentSecretHint, minDeploymentSecretLength } from '../domain/sealing.ts';

/**
 * The dev stack's deployment secret: `<dataDir>/secret`, generated on the first run (48 random
 * bytes in base64, mode 0600) and reused after, so what the stack sealed (the CA key, webhook
 * secrets) opens again on the next run. Two stacks starting at once on one data directory agree:
 * the file is created exclusively, and the loser reads the winner's.
 */
export function devDeploymentSecret(dataDir: string, log: Logger): string {
  const file = path.join(dataDir, 'secret');
  const existing = readSecretFile(file);
  if (existing !== null) return existing;
  const secret = randomBytes(48).toString('base64');
  try {
    writeFileSync(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return readSecretFile(file)!;
    throw error;
  }
  log.info({ file }, 'generated the deployment secret of this data directory');
  return secret;
}

function readSecretFile(file: string): string | null {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw error;
  }
  if (text.length < minDeploymentSecretLength) {
    throw new Error(
      `${file} holds fewer than ${minDeploymentSecretLength} characters: put a deployment secret there (${deploymentSecretHint}), or remove the file on a data directory that holds nothing sealed`,
    );
  }
  return text;
}
