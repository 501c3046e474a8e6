// Browser test of the dashboard: a real `parsyn server`, real `parsyn worker` processes on tiny Llama LoRA jobs, and
// Debian's chromium driven headless by playwright-core. Screenshots of every page go to --out.
//
// Jobs: one through the form (live view, stop, download); one whose third worker's task always fails (every attempt
// of its round lists its participants and who was dropped and why, without paths of the worker's disk); one that
// runs to success (the final evaluation is never a round above total_rounds; the workers' cards show their real
// state afterwards; validation loss "after round r" agrees between table, chart and API).
//
//   node dashboard_test.mjs --parsyn build/src/cli/parsyn --out build/web-screenshots
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { arg, Children, launchChromium, log, playwrightOrSkip, startServer, uploadModel, waitFor } from './harness.mjs';

const { chromium } = await playwrightOrSkip();
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const OUT = path.resolve(arg('out', 'web-screenshots'));
fs.mkdirSync(OUT, { recursive: true });

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-web-'));
const children = new Children(PARSYN, tmp);
const start = (name, args, env) => children.start(name, args, env);
let failed = false;

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
  // A trainer that refuses its data as parsyn-trainer does (its error event names the file by its full path on the
  // worker's disk), for a worker whose every task must fail. A worker's own --data file would not do: in a job over
  // the platform's dataset it trains on its shard.
  const refusal = path.join(tmp, 'refusal.jsonl');
  fs.writeFileSync(refusal, `${JSON.stringify({ event: 'error', code: 'invalid_argument',
    message: `${path.join(tmp, 'cache-gamma', 'broken.jsonl')}: line 1: "text" is empty` })}\n`);
  const described = JSON.stringify({ contract_versions: [1], task_kinds: ['train', 'evaluate'], model_kinds: ['*'] });
  const refusingTrainer = path.join(tmp, 'refusing-trainer.sh');
  fs.writeFileSync(refusingTrainer,
    `#!/bin/sh\nif [ "$1" = --describe ]; then echo '${described}'; exit 0; fi\ncat '${refusal}'\nexit 1\n`,
    { mode: 0o755 });

  const dataDir = path.join(tmp, 'server');
  const { base, key, call } = await startServer(children, dataDir,
    ['--heartbeat-interval-ms', '300', '--heartbeat-timeout-ms', '3000', '--max-poll-wait-ms', '2000']);
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

  const model = await uploadModel(call, path.join(tmp, 'model'), 'tiny-llama');
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
  const context = await launchChromium(chromium, tmp);
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

    // A real job through the form, advanced section included: two own workers, 3 steps a round, more rounds than the
    // test watches before it stops the job (a round takes about 0.15 s on a fast machine: 8 rounds ended before Stop).
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
    for (const [field, value] of [['num_rounds', '400'], ['steps_per_round', '3'], ['min_workers', '2'],
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
    // Throughput with its unit (a language model: tokens/s); utilisation says what it measures.
    const throughput = await waitFor('a worker card to show its throughput', async () => {
      const texts = await page.$$eval('.worker-card .stat-throughput', (els) => els.map((e) => e.textContent));
      return texts.find((t) => t !== '—');
    }, 120_000);
    assert.match(throughput, /^[\d.]+ tokens\/s$/, 'throughput names its unit');
    const utilisation = await waitFor('a worker card to show its utilisation', async () => {
      const shown = await page.$$eval('.worker-card', (cards) => cards.map((c) => ({
        label: c.querySelector('.stat-utilization-label').textContent, value: c.querySelector('.stat-utilization').textContent })));
      return shown.find((u) => u.value !== '—');
    }, 120_000);
    assert.match(utilisation.label, /^(Host CPU \(whole machine\)|GPU utilisation)$/, 'utilisation names its device');
    assert.match(utilisation.value, /^\d+ %$/);
    log(`throughput "${throughput}", ${utilisation.label} "${utilisation.value}"`);
    assert.deepEqual(await page.$$eval('#rounds-table thead th', (els) => els.map((e) => e.textContent)),
      ['Round', 'Outcome', 'Participants', 'Dropped', 'Duration', 'Bytes down', 'Bytes up', 'Compression',
        'Train loss', 'Validation loss after round']);
    const lists = {
      training: await page.$$eval('#training-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
      reported: await page.$$eval('#reported-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
      dropped: await page.$$eval('#dropped-list li[data-worker-id]', (els) => els.map((e) => e.textContent)),
    };
    log(`round ${await roundNumber()}; lists ${JSON.stringify(lists)}; worker points ${await pointsOf('.worker-chart')}`);
    for (const name of [...lists.training, ...lists.reported]) assert.ok(['alpha', 'beta'].includes(name), name);
    // The history is re-read at most every 200 ms after a round ends, however fast rounds end.
    await waitFor('a committed round in the round history', async () =>
      (await page.locator('#rounds-table tbody tr[data-outcome="committed"]').count()) >= 1, 10_000);
    // An uncompressed job's updates are as large as its global: the rounds table shows the ratio as 1.00×.
    assert.match(await page.locator('#rounds-table tbody tr[data-outcome="committed"] .compression-ratio').first().textContent(),
      /^1\.0\d×$|^0\.9\d×$/);
    // A committed round moved its workers' updates up and the global (and shards) down.
    for (const cell of ['bytes-down', 'bytes-up']) {
      assert.match(await page.locator(`#rounds-table tbody tr[data-outcome="committed"] .${cell}`).first().textContent(),
        /^\d+(\.\d+)? (B|KiB|MiB|GiB)$/, cell);
    }
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

    // ---- a job whose third worker always fails its task: every attempt lists who took part and who was dropped ----
    const gammaWorker = await call('POST', '/workers', JSON.stringify({ name: 'gamma', kind: 'own' }));
    start('worker-gamma', ['worker', '--server', base, '--token', gammaWorker.token, '--name', 'gamma',
      '--cache-dir', path.join(tmp, 'cache-gamma'), '--threads', '1', '--trainer', `builtin=${refusingTrainer}`]);
    await waitFor('gamma online', async () => {
      const { workers: list } = await call('GET', '/workers');
      return list.filter((w) => w.status === 'online' && [...workers, gammaWorker].some((o) => o.id === w.id)).length === 3;
    }, 60_000, 250);
    const specOf = (name, distributed, workerIds) => JSON.stringify({
      ...stored.spec, name, distributed: { ...stored.spec.distributed, ...distributed },
      worker_selection: { mode: 'own', worker_ids: workerIds } });
    const failing = await call('POST', '/training-jobs', specOf('always-one-short',
      { num_rounds: 1, steps_per_round: 1, min_workers: 3, max_workers: 3, fault_tolerance: 3, join_window: 0 },
      [...workers.map((w) => w.id), gammaWorker.id]));
    await page.goto(`${base}/#/jobs/${failing.id}`);
    await page.locator('#job-status .status', { hasText: 'failed' }).waitFor({ timeout: 240_000 });
    const failedRows = page.locator('#rounds-table tbody tr[data-outcome="failed"]');
    await waitFor('three failed attempts in the history', async () => (await failedRows.count()) === 3, 30_000);
    for (let i = 0; i < 3; i += 1) {
      const row = failedRows.nth(i);
      assert.equal(await row.getAttribute('data-attempt'), String(i + 1));
      const participants = (await row.locator('.participants').textContent()).split(', ').sort();
      assert.deepEqual(participants, ['alpha', 'beta', 'gamma'], `attempt ${i + 1} lists its participants`);
      const dropped = row.locator(`.dropped li[data-worker-id="${gammaWorker.id}"]`);
      await dropped.waitFor({ state: 'attached' });
      const why = await dropped.textContent();
      assert.match(why, /^gamma: .*task failed/, `attempt ${i + 1} says who was dropped and why`);
      assert.match(why, /broken\.jsonl/, 'the reason keeps what failed');
      assert.doesNotMatch(why, /\/(tmp|home|root|var)\/|cache-gamma|parsyn-web-/, `no paths of the worker's disk: ${why}`);
    }
    const failedRounds = (await call('GET', `/training-jobs/${failing.id}/rounds`)).rounds;
    for (const r of failedRounds) {
      for (const u of r.updates) if (u.reason) assert.doesNotMatch(u.reason, /\/(tmp|home|root|var)\//);
      if (r.failure_reason) assert.doesNotMatch(r.failure_reason, /\/(tmp|home|root|var)\//);
    }
    log(`job ${failing.id} failed after 3 attempts, each listing alpha, beta and the dropped gamma`);
    await shot('10-job-detail-failed-attempts');

    // ---- a job that runs to success: the final evaluation ends it, and its workers are free afterwards ----
    await page.evaluate(() => {
      window.roundTexts = new Set();
      window.cardTexts = new Set();
      new MutationObserver(() => {
        const counter = document.querySelector('#round-counter');
        if (counter) window.roundTexts.add(counter.textContent);
        for (const card of document.querySelectorAll('.worker-card .worker-task')) window.cardTexts.add(card.textContent);
      }).observe(document.body, { childList: true, subtree: true, characterData: true });
    });
    const succeeding = await call('POST', '/training-jobs', specOf('runs-to-success',
      { num_rounds: 2, steps_per_round: 3, min_workers: 2, max_workers: 2, fault_tolerance: 2 }, workers.map((w) => w.id)));
    await page.goto(`${base}/#/jobs/${succeeding.id}`);
    // The API's live view while the job runs: never a round above total_rounds; the final evaluation is named.
    const phases = new Set();
    let liveRounds = [];
    for (;;) {
      const view = await call('GET', `/training-jobs/${succeeding.id}`);
      assert.ok(view.current_round <= view.total_rounds, `current_round ${view.current_round} of ${view.total_rounds}`);
      if (view.live?.phase) {
        phases.add(view.live.phase);
        if (view.live.phase === 'final_evaluation') assert.equal(view.live.round, undefined, 'no round number in the final evaluation');
        if (view.live.round !== undefined) liveRounds.push(view.live.round);
        for (const w of view.live.workers ?? []) {
          if (w.progress?.throughput !== undefined) assert.match(w.progress.throughput_unit, /^(tokens|samples)\/s$/);
        }
      }
      if (['succeeded', 'failed', 'stopped', 'cancelled'].includes(view.status)) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.ok(liveRounds.every((r) => r >= 1 && r <= 2), `live rounds ${liveRounds}`);
    log(`job ${succeeding.id} ended; live phases seen: ${[...phases].join(', ')}`);
    await page.locator('#job-status .status', { hasText: 'succeeded' }).waitFor({ timeout: 60_000 });
    // The workers' cards show their real state (online and idle, here), not their last task of the job.
    await waitFor('the worker cards to show the workers idle', async () => {
      const states = await page.$$eval('.worker-card', (cards) => cards.map((c) => c.dataset.state));
      return states.length === 2 && states.every((s) => s === 'idle');
    }, 30_000);
    for (const text of await page.$$eval('.worker-card .worker-task', (els) => els.map((e) => e.textContent))) {
      assert.doesNotMatch(text, /training|evaluat|round/, `a finished job's worker card says "${text}"`);
    }
    assert.equal(await page.locator('#training-list li[data-worker-id]').count(), 0, 'nobody listed as training');
    assert.equal(await page.locator('#reported-list li[data-worker-id]').count(), 0, 'nobody listed as reported');
    // No "round N of M" with N above M, in the counter or on a card, at any time the page showed.
    const seen = await page.evaluate(() => [...window.roundTexts, ...window.cardTexts]);
    for (const text of seen) {
      for (const m of text.matchAll(/(\d+) of (\d+)/g)) {
        if (!/step/.test(text.slice(Math.max(0, m.index - 6), m.index))) {
          assert.ok(Number(m[1]) <= Number(m[2]), `"${text}" shows a round above the total`);
        }
      }
      assert.doesNotMatch(text, /round 3\b/, `"${text}" names a third round of a two-round job`);
    }
    assert.equal(await page.textContent('#round-counter'), '2 of 2 committed');
    // (Whether the page caught the short final evaluation depends on timing: logged, not asserted.)
    log(`round counter texts seen: ${JSON.stringify(await page.evaluate(() => [...window.roundTexts]))}`);
    // The history has rounds 1 and 2 (the final evaluation is no round of it), no "round 3".
    await waitFor('both rounds in the history', async () =>
      (await page.locator('#rounds-table tbody tr[data-outcome="committed"]').count()) === 2, 10_000);
    const roundCells = await page.$$eval('#rounds-table tbody tr th', (els) => els.map((e) => e.textContent));
    assert.deepEqual(roundCells.map((t) => t.replace(/best$/, '')).filter((t) => t !== 'Final evaluation'), ['1', '2']);

    // Validation loss after round r: the table, the chart (x = 0: the starting weights) and the API agree.
    const job3 = await call('GET', `/training-jobs/${succeeding.id}`);
    const apiRounds = (await call('GET', `/training-jobs/${succeeding.id}/rounds`)).rounds.filter((r) => r.outcome === 'committed');
    const chart = JSON.parse(await page.getAttribute('#aggregate-chart', 'data-validation'));
    const fmt = (v) => (Math.abs(v) >= 1000 ? v.toFixed(0) : Number(v.toPrecision(4)).toString());
    const tableAfter = await page.$$eval('#rounds-table tbody tr[data-outcome="committed"]', (rows) =>
      Object.fromEntries(rows.map((r) => [r.dataset.round, r.querySelector('.validation-after').textContent])));
    for (const r of ['1', '2']) assert.equal(tableAfter[r], fmt(chart[r]), `round ${r}: table and chart agree`);
    assert.ok(Number.isFinite(chart['0']), 'the chart has the starting weights at x = 0');
    if (Object.hasOwn(job3, 'initial_validation_loss')) {
      // The server reports each round's committed global's loss.
      assert.equal(fmt(job3.initial_validation_loss), fmt(chart['0']));
      for (const r of apiRounds) assert.equal(fmt(r.validation_loss), tableAfter[String(r.round)], `API round ${r.round}`);
      assert.equal(fmt(job3.final_validation_loss), tableAfter['2']);
    } else {
      // An older server reports, per round, the loss of the global it started from: round r + 1's is "after round r".
      log('the job view has no initial_validation_loss yet: checking against the rounds\' starting globals');
      assert.equal(fmt(apiRounds[0].validation_loss), fmt(chart['0']));
      assert.equal(fmt(apiRounds[1].validation_loss), tableAfter['1']);
    }
    const best = Object.hasOwn(job3, 'best_round') ? job3.best_round
      : Number(Object.entries(chart).filter(([r]) => r >= 1).sort((a, b) => a[1] - b[1])[0][0]);
    assert.equal(await page.getAttribute('#rounds-table tbody tr[data-best="true"]', 'data-round'), String(best), 'best round highlighted');
    assert.match(await page.textContent('#loss-summary'), new RegExp(`best after round ${best} `));
    // Warnings: shown when the server gives any, hidden when it gives none.
    const warnings = job3.warnings ?? [];
    assert.equal(await page.locator('#job-warnings').isVisible(), warnings.length > 0, 'the warnings notice');
    for (const w of warnings) assert.ok((await page.textContent('#job-warnings')).includes(w));
    log(`job ${succeeding.id}: validation after rounds ${JSON.stringify(chart)}, best round ${best}, warnings ${warnings.length}`);
    await shot('11-job-detail-succeeded');

    // The Training page shows it done, without workers in it.
    await page.goto(`${base}/#/training`);
    const doneRow = page.locator(`#jobs-table tr[data-job-id="${succeeding.id}"]`);
    await doneRow.waitFor();
    assert.equal(await doneRow.getAttribute('data-status'), 'succeeded');
    assert.equal(await doneRow.locator('.round-text').textContent(), '2 of 2');
    assert.doesNotMatch(await doneRow.textContent(), /in round|evaluating/);

    // A dp_fedavg job under secure aggregation: the round history has a "Privacy ε" column with each committed round's
    // ε, as the API reports, and a "Survivors" column with the workers whose masked inputs each attempt summed.
    const private_ = await call('POST', '/training-jobs', specOf('private',
      { num_rounds: 2, steps_per_round: 1, min_workers: 2, max_workers: 2, fault_tolerance: 2, strategy: 'dp_fedavg',
        strategy_options: { clip_norm: 1.0, noise_multiplier: 1.0, delta: 1e-5 },
        secure_aggregation: { enabled: true, clipping_range: 0.5 } }, workers.map((w) => w.id)));
    await page.goto(`${base}/#/jobs/${private_.id}`);
    await page.locator('#job-status .status', { hasText: 'succeeded' }).waitFor({ timeout: 240_000 });
    await waitFor('both private rounds in the history', async () =>
      (await page.locator('#rounds-table tbody tr[data-outcome="committed"] .privacy-epsilon').count()) === 2, 10_000);
    const privateHead = await page.$$eval('#rounds-table thead th', (els) => els.map((e) => e.textContent));
    assert.equal(privateHead.at(-1), 'Privacy ε');
    const privateRounds = (await call('GET', `/training-jobs/${private_.id}/rounds`)).rounds.filter((r) => r.outcome === 'committed');
    const epsilonCells = await page.$$eval('#rounds-table tbody tr[data-outcome="committed"]', (rows) =>
      Object.fromEntries(rows.map((r) => [r.dataset.round, r.querySelector('.privacy-epsilon').textContent])));
    const fmtEpsilon = (v) => (Math.abs(v) >= 1000 ? v.toFixed(0) : Number(v.toPrecision(4)).toString());
    for (const r of privateRounds) assert.equal(epsilonCells[String(r.round)], fmtEpsilon(r.privacy.epsilon), `round ${r.round} ε`);
    assert.ok(privateRounds[1].privacy.epsilon > privateRounds[0].privacy.epsilon, 'ε grows with the rounds');
    assert.match(await page.textContent('#job-secure'), /Securely aggregated/);
    assert.equal(privateHead.at(-2), 'Survivors');
    const survivorCells = await page.$$eval('#rounds-table tbody tr[data-outcome="committed"]', (rows) =>
      Object.fromEntries(rows.map((r) => [r.dataset.round, r.querySelector('.secure-survivors').dataset.survivors])));
    for (const r of privateRounds) {
      assert.deepEqual(r.secure_aggregation.masked, workers.map((w) => w.id).sort((a, b) => a - b), `round ${r.round} summed both`);
      assert.equal(survivorCells[String(r.round)], r.secure_aggregation.masked.join(','), `round ${r.round} survivors`);
    }
    log(`dp job ${private_.id}: ε ${privateRounds.map((r) => r.privacy.epsilon).join(', ')}`);
    await shot('12-job-detail-privacy');

    // An asynchronous job: its history has a "Staleness" column with each version's accepted updates' staleness, as
    // the API reports, and the page shows their histogram and each worker's accepted updates.
    const asynchronous = await call('POST', '/training-jobs', specOf('asynchronous',
      { num_rounds: 3, steps_per_round: 1, min_workers: 1, max_workers: 2, fault_tolerance: 2, aggregation: 'async',
        async: { buffer_size: 1, max_staleness: 5 } }, workers.map((w) => w.id)));
    await page.goto(`${base}/#/jobs/${asynchronous.id}`);
    await page.locator('#job-status .status', { hasText: 'succeeded' }).waitFor({ timeout: 240_000 });
    await waitFor('the three versions in the history', async () =>
      (await page.locator('#rounds-table tbody tr[data-outcome="committed"] .update-staleness').count()) === 3, 10_000);
    const versions = (await call('GET', `/training-jobs/${asynchronous.id}/rounds`)).rounds.filter((r) => r.outcome === 'committed');
    const stalenessCells = await page.$$eval('#rounds-table tbody tr[data-outcome="committed"]', (rows) =>
      Object.fromEntries(rows.map((r) => [r.dataset.round, r.querySelector('.update-staleness').dataset.staleness])));
    const accepted = versions.flatMap((r) => r.updates.filter((u) => u.status === 'accepted'));
    for (const r of versions) {
      const own = r.updates.filter((u) => u.status === 'accepted').map((u) => u.staleness);
      assert.equal(own.length, 1, `version ${r.round} has its buffer of one`);
      assert.equal(stalenessCells[String(r.round)], own.join(','), `version ${r.round} staleness`);
    }
    assert.ok(await page.locator('#job-async').isVisible(), 'the asynchronous section');
    const histogram = await page.$$eval('#job-async .staleness-histogram li', (items) =>
      items.map((li) => [Number(li.dataset.staleness), Number(li.dataset.count)]));
    assert.equal(histogram.reduce((n, [, count]) => n + count, 0), accepted.length, 'every accepted update counted');
    const perWorker = await page.$$eval('#job-async .updates-per-hour li', (items) =>
      Object.fromEntries(items.map((li) => [li.dataset.workerId, Number(li.dataset.updates)])));
    for (const u of accepted) assert.ok(perWorker[String(u.worker_id)] >= 1, `worker ${u.worker_id} listed`);
    await waitFor('the three versions on the timeline', async () =>
      (await page.getAttribute('#version-timeline', 'data-points')) === '3', 10_000);
    log(`async job ${asynchronous.id}: staleness ${JSON.stringify(histogram)}, updates ${JSON.stringify(perWorker)}`);
    await shot('13-job-detail-async');
    await page.goto(`${base}/#/jobs/${jobId}`);
    await page.locator('#job-status .status', { hasText: 'stopped' }).waitFor();

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
  children.dumpLogs();
} finally {
  await children.stopAll();
  if (!failed && !process.env.PARSYN_KEEP_WEB_TEST) fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
