// What the dashboard's browser tests share: their command-line flags, bounded waits, `parsyn` child processes (each
// in its own process group, its output in a log file, all ended when the test ends), a server with its admin API
// client, model uploads, and Debian's chromium through playwright-core.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { skipForMissingDependency } from '../missing_dependency.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

// playwright-core, or exit 77 (CTest's skip) when tests/web/node_modules is absent.
export async function playwrightOrSkip() {
  if (!fs.existsSync(path.join(here, 'node_modules', 'playwright-core'))) {
    skipForMissingDependency('tests/web/node_modules is absent (./dev setup installs it)');
  }
  return import('playwright-core');
}

// The value after --name on the command line, else `fallback`.
export function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

export function log(message) {
  console.log(`[${new Date().toISOString().slice(11, 19)}] ${message}`);
}

// Polls `condition` (sync or async) until it returns a truthy value; fails after `ms` with `what`.
export async function waitFor(what, condition, ms = 60_000, every = 100) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, every));
  }
}

// The `parsyn` processes a test starts, their logs under `tmp`.
export class Children {
  constructor(parsyn, tmp) {
    this.parsyn = parsyn;
    this.tmp = tmp;
    this.list = [];
  }

  // Starts `parsyn args...` in its own process group (so its trainer child ends with it); `env` adds variables.
  start(name, args, env = {}) {
    const logFile = path.join(this.tmp, `${name}.log`);
    const out = fs.openSync(logFile, 'w');
    const child = spawn(this.parsyn, args, { stdio: ['ignore', out, out], detached: true,
                                             env: { ...process.env, ...env } });
    this.list.push({ name, child, logFile });
    return { child, logFile };
  }

  // Prints the end of every log (after a failure).
  dumpLogs() {
    for (const { name, logFile } of this.list) {
      const text = fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : '';
      console.error(`---- ${name} (last 3000 chars) ----\n${text.slice(-3000)}`);
    }
  }

  // SIGTERM to every group, then SIGKILL to those still running after 15 s.
  async stopAll() {
    const running = ({ child }) => child.exitCode === null && child.signalCode === null;
    for (const entry of this.list.filter(running)) {
      try {
        process.kill(-entry.child.pid, 'SIGTERM');
      } catch {
        // Already gone.
      }
    }
    await waitFor('our processes to exit', () => !this.list.some(running), 15_000).catch(() => {
      for (const { child } of this.list) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
    });
  }
}

// `parsyn server` on 127.0.0.1 (a free port) with its data in `dataDir`: its base URL, admin key, and `call(method,
// route, body, contentType)` for the API under /api/v1 (asserts a 2xx; the JSON answer, or null).
export async function startServer(children, dataDir, extra = []) {
  const server = children.start('server', ['server', '--data-dir', dataDir, '--listen', '127.0.0.1:0', ...extra]);
  const base = await waitFor('the server to listen', () => {
    const m = /parsyn server listening on (http:\/\/\S+)/.exec(fs.readFileSync(server.logFile, 'utf8'));
    if (!m && server.child.exitCode !== null) throw new Error(`server exited: ${fs.readFileSync(server.logFile, 'utf8')}`);
    return m && m[1];
  }, 30_000);
  const key = fs.readFileSync(path.join(dataDir, 'admin-key'), 'utf8').trim();
  const call = async (method, route, body, contentType = 'application/json') => {
    const r = await fetch(`${base}/api/v1${route}`, {
      method, body, headers: { Authorization: `Bearer ${key}`, ...(body ? { 'Content-Type': contentType } : {}) } });
    const text = await r.text();
    assert.ok(r.ok, `${method} ${route}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  return { base, key, call, server };
}

// Uploads every file of the folder `dir` and registers it as the model `name`: the model as the API answers it.
export async function uploadModel(call, dir, name) {
  const files = {};
  for (const file of fs.readdirSync(dir)) {
    const up = await call('POST', '/uploads', fs.readFileSync(path.join(dir, file)), 'application/octet-stream');
    files[file] = up.upload_id;
  }
  return call('POST', '/models', JSON.stringify({ name, files }));
}

// Debian's chromium, headless, with a profile of its own under `tmp`.
export async function launchChromium(chromium, tmp, viewport = { width: 1280, height: 800 }) {
  return chromium.launchPersistentContext(fs.mkdtempSync(path.join(tmp, 'chromium-')), {
    executablePath: '/usr/bin/chromium',
    headless: true,
    viewport,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

// Signs the page in with the admin key and waits for the Training page.
export async function signIn(page, base, key) {
  await page.goto(base);
  await page.fill('#api-key', key);
  await page.keyboard.press('Enter');
  await page.locator('h1', { hasText: 'Training' }).waitFor();
}

// Runs a test's `main`, then ends its processes (`children`, and `stop()` for others) and exits: 0 when it passed
// (its scratch folder `tmp` removed), 1 when it threw (the error and the end of every log printed, `tmp` kept).
export async function runTest(main, children, tmp, stop = () => {}) {
  let failed = false;
  try {
    await main();
  } catch (err) {
    failed = true;
    console.error(err);
    children.dumpLogs();
  } finally {
    stop();
    await children.stopAll();
    if (!failed) fs.rmSync(tmp, { recursive: true, force: true });
  }
  process.exit(failed ? 1 : 0);
}
