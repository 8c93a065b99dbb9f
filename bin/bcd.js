#!/usr/bin/env node
// bcd, the node agent, run directly from its TypeScript sources (tsx).
import { register } from 'tsx/esm/api';

register();
await import('../daemon/main.ts');
