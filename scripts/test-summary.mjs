// Prints the plain `N passed, N failed` line CI reads, from vitest's JSON report.
import { existsSync, readFileSync } from 'node:fs';

const file = process.argv[2] ?? '.data/test-results.json';
if (!existsSync(file)) {
  console.log('0 passed, 1 failed');
  console.error(`no test report at ${file}: the test run did not finish`);
  process.exit(1);
}
const report = JSON.parse(readFileSync(file, 'utf8'));
const passed = report.numPassedTests ?? 0;
// A file that failed to load counts as a failure even though none of its tests ran.
const failed =
  (report.numFailedTests ?? 0) +
  ((report.numFailedTestSuites ?? (0 > 0 && (report.numFailedTests ?? 0) === 0))
    ? report.numFailedTestSuites
    : 0);
const skipped = (report.numPendingTests ?? 0) + (report.numTodoTests ?? 0);
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(failed > 0 || passed === 0 ? 1 : 0);
