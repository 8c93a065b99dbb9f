#!/usr/bin/env node
// The `better-compute` command. In a checkout it runs the TypeScript sources through tsx, so
// `npm run dev` needs no build step; the published package (no sources) runs the compiled dist/.
import { existsSync } from 'node:fs';

const sources = new URL('../cli/main.ts', import.meta.url);
if (existsSync(sources)) {
  const { register } = await import('tsx/esm/api');
  register();
  await import(sources.href);
} else {
  await import('../dist/cli/main.js');
}
