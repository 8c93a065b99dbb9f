// Builds (or finds) what the production-shaped cluster needs in the tools cache: the Temporal
// server and its SQL schema tool from their Go module, and HAProxy from Debian's packages.
// `npx tsx scripts/cluster-tools.ts` prints their paths as JSON; .ci/run runs it before the suite.
import { createLogger } from '../core/logger.ts';
import { ensureHaproxy, ensureTemporalServer } from '../server/cluster-tools.ts';
import { defaultToolsDir } from '../temporal/dev-server.ts';

const toolsDir = process.env.BETTER_COMPUTE_TOOLS_DIR ?? defaultToolsDir();
const log = createLogger({ level: 'info', name: 'cluster-tools', format: 'json' });
// wall time: how long it took, for CI's log
const started = Date.now();
const haproxy = ensureHaproxy(toolsDir, log);
const temporal = await ensureTemporalServer(toolsDir, log);
console.log(JSON.stringify({ temporal, haproxy, seconds: Math.round((Date.now() - started) / 1000) }));
