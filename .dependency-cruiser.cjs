/**
 * The layering rule of DESIGN.md, checked by `npm run check` (and by tests/layering/): arrows point
 * down, and there are no cycles. A folder may import only the folders listed for it here.
 */
const layers = {
  proto: [],
  domain: ['proto'],
  migrations: [],
  core: ['domain'],
  db: ['domain', 'core', 'migrations'],
  iam: ['domain', 'core', 'db'],
  activities: ['domain', 'core', 'db', 'iam'],
  workflows: ['domain', 'core', 'activities'],
  events: ['domain', 'core', 'db', 'iam'],
  temporal: ['domain', 'core', 'db', 'iam', 'activities', 'workflows', 'events'],
  api: ['domain', 'core', 'db', 'iam', 'events'],
  gateway: ['domain', 'core', 'db', 'proto', 'events'],
  daemon: ['domain', 'core', 'proto'],
  client: ['domain'],
  server: [
    'domain',
    'core',
    'db',
    'iam',
    'activities',
    'workflows',
    'events',
    'temporal',
    'api',
    'gateway',
    'daemon',
  ],
  cli: ['domain', 'core', 'client', 'daemon', 'server'],
};

/**
 * Folders a layer may name in `import type` only: the typed client and the CLI derive their types
 * from the method registry, and nothing of it is loaded at run time (tests/client/bundle proves it).
 */
const typesFrom = {
  client: ['api', 'server'],
  cli: ['api'],
};

const folders = Object.keys(layers);
const notListed = (allowed) => `^(${folders.filter((f) => !allowed.includes(f)).join('|')})/`;

module.exports = {
  forbidden: [
    ...Object.entries(layers).map(([folder, allowed]) => ({
      name: `${folder}-imports-only-below`,
      comment: `${folder}/ may import only ${allowed.length ? allowed.join(', ') : 'nothing of the project'} (DESIGN.md, Layout)`,
      severity: 'error',
      from: { path: `^${folder}/` },
      to: { path: notListed([folder, ...allowed, ...(typesFrom[folder] ?? [])]) },
    })),
    ...Object.entries(typesFrom).map(([folder, typeOnly]) => ({
      name: `${folder}-imports-types-only-from-${typeOnly.join('-')}`,
      comment: `${folder}/ may name ${typeOnly.join(', ')} in \`import type\` only: nothing of them is loaded at run time`,
      severity: 'error',
      from: { path: `^${folder}/` },
      to: { path: `^(${typeOnly.join('|')})/`, dependencyTypesNot: ['type-only'] },
    })),
    {
      name: 'workflows-import-activities-as-types-only',
      comment: 'workflow code runs in the Temporal sandbox: activities are imported with `import type` only',
      severity: 'error',
      from: { path: '^workflows/' },
      to: { path: '^activities/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'no-cycles',
      comment: 'a cycle of imports ties files that should be one, or a seam that points the wrong way',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '(^|/)(node_modules|\\.data|dist)/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
