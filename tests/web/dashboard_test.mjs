// Browser test of the dashboard: a real `parsyn server`, two real `parsyn worker` processes on a tiny Llama LoRA job,
// and Debian's chromium driven headless by playwright-core. Screenshots of every page go to --out.
//
//   node dashboard_test.mjs --parsyn build/src/cli/parsyn --out build/web-screenshots
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
if (!fs.existsSync(path.join(here, 'node_modules', 'playwright-core'))) {
  console.log('SKIP: tests/web/node_modules is absent (./dev setup installs it)');
  process.exit(77);
}
const { chromium } = await import('playwright-core');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const OUT = path.resolve(arg('out', 'web-screenshots'));
const CHROMIUM = '/usr/bin/chromium';
fs.mkdirSync(OUT, { recursive: true });

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-web-'));
const children = [];
let failed = false;

function log(message) {
  console.log(`[${new Date().toISOString().slice(11, 19)}] ${message}`);
}

// Starts a process of ours in its own process group (so its trainer child ends with it); output goes to a log file.
function start(name, args) {
  const logFile = path.join(tmp, `${name}.log`);
  const out = fs.openSync(logFile, 'w');
  const child = spawn(PARSYN, args, { stdio: ['ignore', out, out], detached: true });
  children.push({ name, child, logFile });
  return { child, logFile };
}

function stopChildren() {
  for (const { child } of children) {
    if (child.exitCode === null && child.signalCode === null) {
      try {
        process.kill(-child.pid, 'SIGTERM');
      } catch {
        // Already gone.
      }
    }
  }
}

// Polls `condition` (sync or async) until it returns a truthy value; fails after `ms` with `what`.
async function waitFor(what, condition, ms = 60_000, every = 100) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, every));
  }
}

function writeLearnableText(file, rows) {
  const names = ['alice', 'bob', 'carol', 'dave'];
  const verbs = ['likes', 'sees', 'helps'];
  const lines = [];
  for (let i = 0; i < rows; i += 1) {
    lines.push(JSON.stringify({ text: `${names[i % 4]} ${verbs[Math.floor(i / 4) % 3]} ${names[(i + 1) % 4]}. the end.` }));
  }
  fs.writeFileSync(file, `${lines.join('\n')}\n`);
}

async function main() {
  // ---- a server with a tiny model, a dataset and three registered workers (two started) ----
  log(`parsyn: ${PARSYN}; scratch: ${tmp}`);
  execFileSync(PARSYN, ['model', 'init', '--out', path.join(tmp, 'model'), '--hidden-size', '32', '--layers', '2',
    '--heads', '2', '--max-position-embeddings', '128', '--seed', '3'], { stdio: 'pipe' });
  writeLearnableText(path.join(tmp, 'train.jsonl'), 96);

  const dataDir = path.join(tmp, 'server');
  const server = start('server', ['server', '--data-dir', dataDir, '--listen', '127.0.0.1:0',
    '--heartbeat-interval-ms', '300', '--heartbeat-timeout-ms', '3000', '--max-poll-wait-ms', '2000']);
  const base = await waitFor('the server to listen', () => {
    const m = /parsyn server listening on (http:\/\/\S+)/.exec(fs.readFileSync(server.logFile, 'utf8'));
    if (!m && server.child.exitCode !== null) throw new Error(`server exited: ${fs.readFileSync(server.logFile, 'utf8')}`);
    return m && m[1];
  }, 30_000);
  const key = fs.readFileSync(path.join(dataDir, 'admin-key'), 'utf8').trim();
  log(`server at ${base}`);

  // The page and its files are open routes with their content types; unknown files are 404; the API needs the key.
  const index = await fetch(`${base}/`);
  assert.equal(index.status, 200);
  assert.equal(index.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.match(index.headers.get('content-security-policy'), /default-src 'self'/);
  assert.match(await index.text(), /<script type="module" src="\/ui\/app.js">/);
  const script = await fetch(`${base}/ui/app.js`);
  assert.equal(script.headers.get('content-type'), 'text/javascript; charset=utf-8');
  const uplot = await fetch(`${base}/ui/vendor/uPlot.esm.js`);
  assert.equal(uplot.status, 200, 'uPlot is embedded (web/node_modules installed)');
  const missing = await fetch(`${base}/ui/no-such-file.js`);
  assert.equal(missing.status, 404);
  assert.equal((await missing.json()).error.code, 'not_found');
  assert.equal((await fetch(`${base}/api/v1/workers`)).status, 401);

  const call = async (method, route, body, contentType = 'application/json') => {
    const r = await fetch(`${base}/api/v1${route}`, {
      method, body, headers: { Authorization: `Bearer ${key}`, ...(body ? { 'Content-Type': contentType } : {}) } });
    const text = await r.text();
    assert.ok(r.ok, `${method} ${route}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  const files = {};
  for (const name of fs.readdirSync(path.join(tmp, 'model'))) {
    const up = await call('POST', '/uploads', fs.readFileSync(path.join(tmp, 'model', name)), 'application/octet-stream');
    files[name] = up.upload_id;
  }
  const model = await call('POST', '/models', JSON.stringify({ name: 'tiny-llama', files }));
  const dataset = await call('POST', '/datasets?name=train.jsonl', fs.readFileSync(path.join(tmp, 'train.jsonl')),
    'application/octet-stream');
  const workers = [];
  for (const name of ['alpha', 'beta']) {
    const w = await call('POST', '/workers', JSON.stringify({ name, kind: 'own' }));
    workers.push(w);
    start(`worker-${name}`, ['worker', '--server', base, '--token', w.token, '--name', name,
      '--cache-dir', path.join(tmp, `cache-${name}`), '--threads', '1']);
  }
  await call('POST', '/workers', JSON.stringify({ name: 'gamma-managed', kind: 'managed' }));
  await waitFor('both workers online', async () => {
    const { workers: list } = await call('GET', '/workers');
    return list.filter((w) => w.status === 'online' || w.status === 'busy').length === 2;
  }, 60_000, 250);
  log('model, dataset and workers ready');

  // ---- the browser ----
  const userDataDir = fs.mkdtempSync(path.join(tmp, 'chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 800 },
  });
  try {
    const page = context.pages()[0] ?? await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    // The refused key (401) and the refused job (400) are logged by the browser as failed loads: expected.
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
    });
    const shot = async (name) => {
      await page.screenshot({ path: path.join(OUT, `${name}.png`), fullPage: true });
      log(`screenshot ${name}.png`);
    };

    // Sign-in: nothing but the form without a key; a wrong key is refused.
    await page.goto(base);
    await page.locator('#api-key').waitFor();
    assert.equal(await page.locator('#nav').isVisible(), false, 'navigation hidden before sign-in');
    await shot('01-sign-in');
    await page.fill('#api-key', 'not-the-key');
    await page.keyboard.press('Enter');
    await page.locator('#sign-in-error', { hasText: 'not accepted' }).waitFor();
    await page.fill('#api-key', key);
    await page.keyboard.press('Enter');
    await page.locator('h1', { hasText: 'Training' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('parsyn.apiKey')), key, 'key kept in session storage');
    log('signed in');

    // Keyboard: after signing in the focus is on the page's content; on a fresh load the skip link, then the
    // navigation, are reached with Tab.
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'main');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'New job');
    await page.reload();
    await page.locator('#jobs-table').waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
    await page.keyboard.press('Tab');
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Training');

    // The form shows the API's validation error next to the field it names.
    await page.goto(`${base}/#/jobs/new`);
    await page.locator(`#f-dataset_id option[value="${dataset.id}"]`).waitFor({ state: 'attached' });
    await page.fill('#f-name', 'too-few-workers');
    await page.selectOption('#f-dataset_id', String(dataset.id));
    await page.selectOption('#f-model_id', String(model.id));
    await page.click('#advanced summary');
    await page.check('#f-distributed-enabled');
    await page.fill('#f-distributed-min_workers', '3');
    await page.fill('#f-distributed-max_workers', '2');
    await page.click('#job-form button[type=submit]');
    const minError = page.locator('#err-distributed-min_workers');
    await minError.waitFor({ state: 'visible' });
    assert.match(await minError.textContent(), /distributed\.min_workers \(3\) must be <= distributed\.max_workers \(2\)/);
    assert.equal(await page.getAttribute('#f-distributed-min_workers', 'aria-invalid'), 'true');
    await minError.scrollIntoViewIfNeeded();
    await shot('02-new-job-validation-error');
    log('validation error shown next to distributed.min_workers');

    // Records every worker name the job view ever lists as training or reported (a worker is "reported" only
    // between its accepted update and the next round's start, often well under a second).
    await page.evaluate(() => {
      window.seenInLists = { training: new Set(), reported: new Set() };
      new MutationObserver(() => {
        for (const group of ['training', 'reported']) {
          for (const li of document.querySelectorAll(`#${group}-list li[data-worker-id]`)) {
            window.seenInLists[group].add(li.textContent);
          }
        }
      }).observe(document.body, { childList: true, subtree: true });
    });

    // A real job through the form, advanced section included: two own workers, 3 steps a round.
    await page.goto(`${base}/#/training`);
    await page.goto(`${base}/#/jobs/new`);
    await page.locator(`#f-model_id option[value="${model.id}"]`).waitFor({ state: 'attached' });
    await page.fill('#f-name', 'dashboard-lora');
    await page.selectOption('#f-dataset_id', String(dataset.id));
    await page.selectOption('#f-model_id', String(model.id));
    for (const [field, value] of [['batch_size', '4'], ['learning_rate', '0.003'], ['lora_r', '4'], ['lora_alpha', '8'],
      ['lora_dropout', '0'], ['max_seq_len', '32'], ['validation_fraction', '0.15'], ['seed', '7']]) {
      await page.fill(`#f-config-${field}`, value);
    }
    await page.selectOption('#f-config-lr_scheduler', 'constant');
    await page.click('#advanced summary');
    await page.check('#f-distributed-enabled');
    for (const [field, value] of [['num_rounds', '8'], ['steps_per_round', '3'], ['min_workers', '2'],
      ['max_workers', '2'], ['aggregation_timeout', '120'], ['fault_tolerance', '2']]) {
      await page.fill(`#f-distributed-${field}`, value);
    }
    await page.selectOption('#f-worker_selection-mode', 'own');
    for (const w of workers) await page.check(`#own-workers input[value="${w.id}"]`);
    assert.equal(await page.locator('#managed-workers input').count(), 1, 'the managed worker is offered too');
    await shot('03-new-job-form');
    await page.click('#job-form button[type=submit]');
    await page.waitForURL(/#\/jobs\/\d+$/);
    const jobId = Number(/#\/jobs\/(\d+)$/.exec(page.url())[1]);
    const stored = await call('GET', `/training-jobs/${jobId}`);
    assert.equal(stored.spec.distributed.steps_per_round, 3);
    assert.deepEqual(stored.spec.worker_selection.worker_ids, workers.map((w) => w.id));
    assert.equal(stored.spec.config.lora_r, 4);
    log(`job ${jobId} created through the form`);

    // Live: the round counter advances, every worker's loss curve and the aggregated curve gain points.
    const roundNumber = async () => Number(/^(\d+) of/.exec((await page.textContent('#round-counter')) ?? '')?.[1] ?? 0);
    const firstRound = await waitFor('round 1 to start', async () => (await roundNumber()) >= 1 && roundNumber(), 120_000);
    const sawTraining = await waitFor('a worker listed as training', async () =>
      (await page.locator('#training-list li[data-worker-id]').count()) > 0, 120_000);
    assert.ok(sawTraining);
    const pointsOf = (selector) => page.$$eval(selector, (els) => els.map((e) => Number(e.dataset.points)));
    await waitFor('both workers to report a loss', async () => {
      const points = await pointsOf('.worker-chart');
      return points.length === 2 && points.every((n) => n > 0);
    }, 120_000);
    const workerPointsBefore = await pointsOf('.worker-chart');
    await waitFor('the aggregated curve to gain a point', async () => (await pointsOf('#aggregate-chart'))[0] >= 1, 180_000);
    const aggregateBefore = (await pointsOf('#aggregate-chart'))[0];
    await waitFor('the round counter to advance', async () => (await roundNumber()) > firstRound, 180_000);
    await waitFor('both workers to have been listed as reported and as training', async () => {
      const seen = await page.evaluate(() => ({
        training: [...window.seenInLists.training].sort(), reported: [...window.seenInLists.reported].sort() }));
      return seen.training.join() === 'alpha,beta' && seen.reported.join() === 'alpha,beta';
    }, 180_000);
    await waitFor('every worker curve and the aggregated curve to grow', async () => {
      const now = await pointsOf('.worker-chart');
      const aggregate = (await pointsOf('#aggregate-chart'))[0];
      return now.every((n, i) => n > workerPointsBefore[i]) && aggregate > aggregateBefore;
    }, 180_000);
    const names = await page.$$eval('.worker-card .worker-name', (els) => els.map((e) => e.textContent).sort());
    assert.deepEqual(names, ['alpha', 'beta']);
    const lists = {
      training: await page.$$eval('#training-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
      reported: await page.$$eval('#reported-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
      dropped: await page.$$eval('#dropped-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
    };
    log(`round ${await roundNumber()}; lists ${JSON.stringify(lists)}; worker points ${await pointsOf('.worker-chart')}`);
    for (const name of [...lists.training, ...lists.reported]) assert.ok(['alpha', 'beta'].includes(name), name);
    assert.ok((await page.locator('#rounds-table tbody tr[data-outcome="committed"]').count()) >= 1, 'round history');
    await shot('04-job-detail-live');

    // The Training page lists the job as running with its round bar.
    await page.goto(`${base}/#/training`);
    const row = page.locator(`#jobs-table tr[data-job-id="${jobId}"]`);
    await row.waitFor();
    assert.match(await row.textContent(), /dashboard-lora/);
    assert.equal(await row.getAttribute('data-status'), 'running');
    await shot('05-training-page');

    // Workers page: both online or busy, the managed one offline.
    await page.goto(`${base}/#/workers`);
    await page.locator('#workers-table tr[data-worker-id]').nth(2).waitFor();
    assert.equal(await page.getAttribute(`#workers-table tr[data-worker-id="${workers[0].id}"]`, 'data-status') !== 'offline', true);
    await shot('06-workers-page');

    // Stop: the job ends as stopped after the round in progress, and its result can be downloaded.
    await page.goto(`${base}/#/jobs/${jobId}`);
    await page.locator('#stop-job:not([disabled])').waitFor();
    await page.click('#stop-job');
    await page.locator('#job-status .status', { hasText: 'stopped' }).waitFor({ timeout: 180_000 });
    assert.equal(await page.isDisabled('#stop-job'), true);
    const downloadButton = page.locator('#artifacts button[data-artifact="adapter_model.safetensors"]');
    await downloadButton.waitFor({ timeout: 30_000 });
    const { artifacts } = await call('GET', `/training-jobs/${jobId}/artifacts`);
    const adapter = artifacts.find((a) => a.name === 'adapter_model.safetensors');
    const [download] = await Promise.all([page.waitForEvent('download'), downloadButton.click()]);
    const saved = path.join(tmp, 'download');
    await download.saveAs(saved);
    assert.equal(fs.statSync(saved).size, adapter.size_bytes, 'the downloaded result is the stored artifact');
    // The round in progress when the job stopped is recorded as failed in the history.
    await waitFor('the round history to show no round running', async () =>
      (await page.locator('#rounds-table tbody tr[data-outcome="running"]').count()) === 0, 10_000);
    log(`stopped; downloaded ${download.suggestedFilename()} (${fs.statSync(saved).size} bytes)`);
    await shot('07-job-detail-stopped');

    // Narrow window and the dark scheme.
    await page.setViewportSize({ width: 390, height: 844 });
    await shot('08-job-detail-narrow');
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.setViewportSize({ width: 1280, height: 800 });
    const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert.equal(background, 'rgb(17, 20, 24)', 'dark scheme applied');
    await shot('09-job-detail-dark');

    assert.deepEqual(pageErrors, [], 'no errors in the page');
  } finally {
    await context.close();
  }
}

try {
  await main();
  log('PASS');
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error.stack ?? error}`);
  for (const { name, logFile } of children) {
    const text = fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : '';
    console.error(`---- ${name} (last 3000 chars) ----\n${text.slice(-3000)}`);
  }
} finally {
  stopChildren();
  await waitFor('our processes to exit', () => children.every(({ child }) => child.exitCode !== null || child.signalCode !== null), 15_000)
    .catch(() => {
      for (const { child } of children) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
    });
  if (!failed && !process.env.PARSYN_KEEP_WEB_TEST) fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
