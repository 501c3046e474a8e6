// Generates a TypeScript client from docs/openapi.yaml with openapi-typescript and compiles it, with
// client_usage.ts (calls through openapi-fetch, and specs the types must refuse), under tsc --strict --noEmit.
// Offline: everything comes from this folder's node_modules (npm ci). Usage: node client_test.mjs [openapi.yaml].
// Exits 77 (skipped) when node_modules is absent.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import test from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { skipForMissingDependency } from '../missing_dependency.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const modules = join(here, 'node_modules');
if (!existsSync(join(modules, 'openapi-typescript')) || !existsSync(join(modules, 'typescript'))) {
  skipForMissingDependency('tests/openapi/node_modules is missing (run ./dev setup)');
}
const { default: openapiTS, astToString } = await import('openapi-typescript');
const documentPath = resolve(process.argv[2] ?? join(here, '..', '..', 'docs', 'openapi.yaml'));

test('the generated client compiles under tsc --strict', async (t) => {
  const work = mkdtempSync(join(tmpdir(), 'parsyn-openapi-client-'));
  t.after(() => rmSync(work, { recursive: true, force: true }));
  // A default makes a field optional in a request, not present in every answer: keep such fields optional.
  const ast = await openapiTS(pathToFileURL(documentPath), { defaultNonNullable: false });
  const generated = astToString(ast);
  // The job spec's objects are typed, not `Record<string, never>` or `unknown`.
  for (const name of ['TrainingConfig', 'DistributedConfig', 'EarlyStopping', 'WorkerSelection', 'JobData']) {
    assert.match(generated, new RegExp(`\\b${name}: \\{`), `${name} is not a typed object in the client`);
  }
  writeFileSync(join(work, 'parsyn-api.ts'), generated);
  copyFileSync(join(here, 'client_usage.ts'), join(work, 'client_usage.ts'));
  symlinkSync(modules, join(work, 'node_modules'), 'dir');
  writeFileSync(join(work, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      strict: true, noEmit: true, target: 'ES2022', module: 'ESNext', moduleResolution: 'Bundler',
      lib: ['ES2022', 'DOM'], types: [], noUnusedLocals: true, exactOptionalPropertyTypes: false,
    },
    files: ['parsyn-api.ts', 'client_usage.ts'],
  }));
  const tsc = spawnSync(process.execPath, [join(modules, 'typescript', 'bin', 'tsc'), '-p', work], { encoding: 'utf8' });
  assert.equal(tsc.status, 0, `tsc failed:\n${tsc.stdout}${tsc.stderr}`);
});
