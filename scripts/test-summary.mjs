// Prints the plain `N passed, N failed` line CI reads, from vitest's JSON report.
import { existsSync, readFileSync } from 'node:fs';

const file = process.argv[2] ?? '.data/test-results.json';
if (!existsSync(file)) {
  console.error(`no test report at ${file}: the test run did not finish`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}
const report = JSON.parse(readFileSync(file, 'utf8'));
const passed = report.numPassedTests ?? 0;
// A test file that fails to load has no failed test of its own: count the file as one failure.
const brokenFiles = (report.testResults ?? []).filter(
  (file) => file.status === 'failed' && (file.assertionResults ?? []).every((t) => t.status !== 'failed'),
).length;
const failed = (report.numFailedTests ?? 0) + brokenFiles;
const skipped = (report.numPendingTests ?? 0) + (report.numTodoTests ?? 0);
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed > 0 || passed === 0 ? 1 : 0);
