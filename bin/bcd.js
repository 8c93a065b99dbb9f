#!/usr/bin/env node
// bcd, the node agent. In a checkout it runs the TypeScript sources through tsx; the published
// package (no sources) runs the compiled dist/.
import { existsSync } from 'node:fs';

const sources = new URL('../daemon/main.ts', import.meta.url);
if (existsSync(sources)) {
  const { register } = await import('tsx/esm/api');
  register();
  await import(sources.href);
} else {
  await import('../dist/daemon/main.js');
}
