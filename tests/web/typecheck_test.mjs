// The dashboard's modules under tsc --checkJs --strict --noEmit (tsconfig.json beside this file names them; their
// types are JSDoc annotations, the modules stay plain JavaScript without a build step). typescript is pinned in
// package.json. Exit status: tsc's (0: no errors), or 77 (skipped) when tests/web/node_modules is absent.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const tsc = join(here, 'node_modules', 'typescript', 'bin', 'tsc');
if (!existsSync(tsc)) {
  console.log('SKIP: tests/web/node_modules is absent (./dev setup installs it)');
  process.exit(77);
}
const run = spawnSync(process.execPath, [tsc, '-p', join(here, 'tsconfig.json')], { stdio: 'inherit' });
process.exit(run.status ?? 1);
