// Creates the tools cache's virtual environment with the Redfish emulator (sushy-tools from PyPI),
// for tests and `npm run dev`: `npx tsx scripts/sushy-tools.ts` prints the emulator's path.
import os from 'node:os';
import path from 'node:path';
import { ensureSushyEmulator } from '../daemon/redfish-emulator.ts';

const toolsDir =
  process.env.BETTER_COMPUTE_TOOLS_DIR ??
  path.join(process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), '.cache'), 'better-compute', 'tools');
console.log(ensureSushyEmulator(toolsDir));
