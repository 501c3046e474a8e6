// The dashboard's modules (every web/app/*.js) under tsc --checkJs --strict --noEmit (tsconfig.json beside this file;
// their types are JSDoc annotations, the modules stay plain JavaScript without a build step; types/ declares the two
// modules the build adds beside them: the generated training_defaults.js and the vendored uPlot). typescript is pinned in
// package.json. Exit status: tsc's (0: no errors), or 77 (skipped) when tests/web/node_modules is absent.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { skipForMissingDependency } from '../missing_dependency.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const tsc = join(here, 'node_modules', 'typescript', 'bin', 'tsc');
// charts.js is checked against uPlot's own declarations (types/vendor/uPlot.esm.d.ts), from web/node_modules.
const uplot = join(here, '..', '..', 'web', 'node_modules', 'uplot', 'dist', 'uPlot.d.ts');
if (!existsSync(tsc) || !existsSync(uplot)) {
  skipForMissingDependency('tests/web/node_modules or web/node_modules is absent (./dev setup installs them)');
}
const run = spawnSync(process.execPath, [tsc, '-p', join(here, 'tsconfig.json')], { stdio: 'inherit' });
process.exit(run.status ?? 1);
