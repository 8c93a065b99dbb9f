#!/usr/bin/env node
// Runs the TypeScript CLI directly (tsx), so the package needs no build step.
import { register } from 'tsx/esm/api';

register();
await import('../cli/main.ts');
