// Browser test of the job form's warnings: a real `parsyn server` (no workers: the job only has to be created) and
// Debian's chromium driven headless by playwright-core. The product spec's example settings (config.epochs 3 with
// distributed.steps_per_round 500) create the job, and the job page the form opens says that epochs is ignored.
// Then the form's strategies (their options) and data partition: a Dirichlet job whose page shows label histograms.
// Last, the Training and Workers pages follow GET /api/v1/events: a job created and cancelled through the API, and a
// worker registered, saying hello and goodbye, change their rows without a page load or a re-read of the list.
//
//   node job_warnings_test.mjs --parsyn build/src/cli/parsyn
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { arg, Children, runTest, launchChromium, playwrightOrSkip, signIn, startServer, uploadModel, waitFor } from './harness.mjs';

const { chromium } = await playwrightOrSkip();
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-web-warnings-'));
const children = new Children(PARSYN, tmp);

async function main() {
  execFileSync(PARSYN, ['model', 'init', '--out', path.join(tmp, 'model'), '--hidden-size', '32', '--layers', '1',
    '--heads', '2', '--seed', '3'], { stdio: 'pipe' });
  // Each row has a topic too: the partitioned job below splits by it (other keys of a text row are ignored).
  const rows = Array.from({ length: 40 }, (_, k) => JSON.stringify({ text: `row ${k} of the data.`,
    topic: k % 3 === 0 ? 'sports' : 'news' }));
  fs.writeFileSync(path.join(tmp, 'train.jsonl'), `${rows.join('\n')}\n`);

  const { base, key, call } = await startServer(children, path.join(tmp, 'server'));
  const model = await uploadModel(call, path.join(tmp, 'model'), 'tiny-llama');
  const dataset = await call('POST', '/datasets?name=train.jsonl', fs.readFileSync(path.join(tmp, 'train.jsonl')),
    'application/octet-stream');

  const context = await launchChromium(chromium, tmp);
  try {
    const page = context.pages()[0] ?? await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await signIn(page, base, key);

    await page.goto(`${base}/#/jobs/new`);
    await page.locator(`#f-model_id option[value="${model.id}"]`).waitFor({ state: 'attached' });
    await page.fill('#f-name', 'epochs-and-steps');
    await page.selectOption('#f-dataset_id', String(dataset.id));
    await page.selectOption('#f-model_id', String(model.id));
    await page.fill('#f-config-epochs', '3');
    await page.click('#advanced summary');
    await page.check('#f-distributed-enabled');
    await page.fill('#f-distributed-steps_per_round', '500');
    await page.click('#job-form button[type=submit]');

    // The job page it opens shows the job's warnings (the job view's `warnings`, kept with the job).
    await page.waitForURL(/#\/jobs\/\d+$/);
    const jobId = Number(/#\/jobs\/(\d+)$/.exec(page.url())[1]);
    const notice = page.locator('#job-warnings');
    await notice.waitFor({ state: 'visible' });
    const text = await notice.textContent();
    assert.match(text, /Warnings/);
    assert.match(text, /config\.epochs is ignored: distributed\.steps_per_round \(500\) sets each round's length; set steps_per_round to 0 to train config\.epochs passes per round/);
    assert.match(text, /fewer than 1,000/);
    const stored = await call('GET', `/training-jobs/${jobId}`);
    assert.equal(stored.warnings.length, 2, JSON.stringify(stored.warnings));
    assert.ok(text.includes(stored.warnings[1]), text);
    // They stay with the job: a fresh load of its page shows them again.
    await page.goto(`${base}/#/training`);
    await page.locator('#jobs-table').waitFor();
    await page.goto(`${base}/#/jobs/${jobId}`);
    await page.locator('#job-warnings').waitFor({ state: 'visible' });
    assert.ok((await page.locator('#job-warnings').textContent()).includes(stored.warnings[0]));
    console.log(`job ${jobId}: its page showed ${stored.warnings.length} warnings`);

    await strategiesAndPartition(page, call, base, dataset, model);
    await liveLists(page, call, base, dataset, model);
    assert.deepEqual(pageErrors, []);
  } finally {
    await context.close();
  }
}

// The form's strategies (each showing only its options, sent as distributed.strategy_options) and data partition
// (a Dirichlet job over the rows' topic: an option error placed by its field, then the job page's label histograms).
async function strategiesAndPartition(page, call, base, dataset, model) {
  const options = {
    federated_averaging: [], fedprox: ['mu'], fedavgm: ['server_learning_rate', 'server_momentum'],
    fedadam: ['server_learning_rate', 'beta1', 'beta2', 'tau'], fedyogi: ['server_learning_rate', 'beta1', 'beta2', 'tau'],
    fedadagrad: ['server_learning_rate', 'beta1', 'tau'], median: [], trimmed_mean: ['beta'], krum: ['f'],
    multi_krum: ['f', 'm'], dp_fedavg: ['clip_norm', 'noise_multiplier', 'delta'],
  };
  const openForm = async () => {
    await page.goto(`${base}/#/training`);
    await page.locator('#jobs-table').waitFor();
    await page.goto(`${base}/#/jobs/new`);
    await page.locator(`#f-model_id option[value="${model.id}"]`).waitFor({ state: 'attached' });
    await page.click('#advanced summary');
  };
  await openForm();
  const offered = await page.locator('#f-distributed-strategy option').evaluateAll((os) => os.map((o) => o.value));
  assert.deepEqual(offered, Object.keys(options));
  const shownOptions = () => page.locator('#strategy-options .field:not([hidden]) input')
    .evaluateAll((inputs) => inputs.map((i) => i.name.replace('distributed.strategy_options.', '')));
  for (const [strategy, names] of Object.entries(options)) {
    await page.selectOption('#f-distributed-strategy', strategy);
    assert.deepEqual(await shownOptions(), [...names, 'sample_fraction', 'sample_count'], strategy);
  }
  // fedprox's mu goes as distributed.strategy_options, without another strategy's option typed before.
  await page.selectOption('#f-distributed-strategy', 'fedadam');
  await page.fill('#f-distributed-strategy_options-beta1', '0.8');
  await page.selectOption('#f-distributed-strategy', 'fedprox');
  await page.fill('#f-distributed-strategy_options-mu', '0.1');
  await page.fill('#f-name', 'proximal');
  await page.selectOption('#f-dataset_id', String(dataset.id));
  await page.selectOption('#f-model_id', String(model.id));
  await page.check('#f-distributed-enabled');
  const [request] = await Promise.all([
    page.waitForRequest((r) => r.method() === 'POST' && r.url().endsWith('/api/v1/training-jobs')),
    page.click('#job-form button[type=submit]'),
  ]);
  // The form opens the new job's page once its POST is answered: wait for that, or it would land after the next goto.
  await page.waitForURL(/#\/jobs\/\d+$/);
  const sent = request.postDataJSON();
  assert.equal(sent.distributed.strategy, 'fedprox');
  assert.deepEqual(sent.distributed.strategy_options, { mu: 0.1 });
  assert.equal(sent.distributed.partition, undefined);  // the default partition is left out

  // Partition settings show for their method only.
  await openForm();
  const shown = (id) => page.locator(`#${id}`).evaluate((el) => !el.closest('.field').hidden);
  assert.equal(await shown('f-distributed-partition-alpha'), false);
  await page.selectOption('#f-distributed-partition-method', 'shards_per_worker');
  assert.equal(await shown('f-distributed-partition-classes_per_worker'), true);
  assert.equal(await shown('f-distributed-partition-alpha'), false);
  await page.selectOption('#f-distributed-partition-method', 'dirichlet');
  assert.equal(await shown('f-distributed-partition-alpha'), true);
  assert.equal(await shown('f-distributed-partition-classes_per_worker'), false);

  // federated_averaging over a Dirichlet split: alpha -1 is refused by its field, 0.5 creates the job.
  await page.fill('#f-name', 'skewed');
  await page.selectOption('#f-dataset_id', String(dataset.id));
  await page.selectOption('#f-model_id', String(model.id));
  await page.check('#f-distributed-enabled');
  await page.fill('#f-distributed-steps_per_round', '5');
  await page.fill('#f-distributed-partition-alpha', '-1');
  await page.fill('#f-distributed-partition-label', 'topic');
  await page.click('#job-form button[type=submit]');
  const alphaError = page.locator('#err-distributed-partition-alpha');
  await waitFor('the alpha error', async () => (await alphaError.textContent()).length > 0);
  assert.equal(await alphaError.textContent(), 'distributed.partition.alpha (-1) must be > 0 and <= 1e+06');
  assert.equal(await page.getAttribute('#f-distributed-partition-alpha', 'aria-invalid'), 'true');
  assert.equal(await page.locator('#form-error').textContent(), '');
  await page.fill('#f-distributed-partition-alpha', '0.5');
  await page.click('#job-form button[type=submit]');
  await page.waitForURL(/#\/jobs\/\d+$/);
  const jobId = Number(/#\/jobs\/(\d+)$/.exec(page.url())[1]);
  const stored = await call('GET', `/training-jobs/${jobId}`);
  assert.deepEqual(stored.spec.distributed.partition, { method: 'dirichlet', alpha: 0.5, label: 'topic' });
  assert.equal(stored.spec.distributed.strategy, 'federated_averaging');
  const job = await waitFor('the job\'s shards', async () => {
    const view = await call('GET', `/training-jobs/${jobId}`);
    return view.shards.length > 0 && view;
  });
  await page.locator('#job-shards').waitFor({ state: 'visible' });
  await waitFor('the shards table', async () => (await page.locator('#shards-table tbody tr').count()) === job.shards.length);
  for (const shard of job.shards) {
    const text = await page.locator(`#shards-table tr[data-shard="${shard.shard}"] .histogram-text`).textContent();
    const expected = ['news', 'sports'].filter((l) => shard.label_histogram[l]).map((l) => `${l}: ${shard.label_histogram[l]}`);
    assert.equal(text, expected.join(', '));
  }
  assert.match(await page.locator('#partition-method').textContent(), /Method dirichlet \(alpha 0\.5, label topic\)/);
  console.log(`job ${jobId}: ${job.shards.length} shards, histograms ${JSON.stringify(job.shards.map((s) => s.label_histogram))}`);
}

// The lists are read once, then patched from the events stream: rows change while no request re-reads the list.
async function liveLists(page, call, base, dataset, model) {
  const listReads = { '/api/v1/training-jobs': 0, '/api/v1/workers': 0 };
  let streams = 0;
  page.on('request', (r) => {
    const url = new URL(r.url());
    if (r.method() === 'GET' && url.pathname in listReads) listReads[url.pathname] += 1;
    if (url.pathname === '/api/v1/events') streams += 1;
  });
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const statusOf = (row) => row.getAttribute('data-status');

  await page.goto(`${base}/#/training`);
  await page.locator('#jobs-table tbody tr').first().waitFor();
  await waitFor('the first read of the jobs list', () => listReads['/api/v1/training-jobs'] === 1);
  // Set on the page's window: still there after the changes means the page was not loaded again.
  await page.evaluate(() => { window.parsynNoReload = true; });

  const job = await call('POST', '/training-jobs', JSON.stringify({ name: 'followed-live', dataset_id: dataset.id,
    model_id: model.id, distributed: { enabled: true, min_workers: 1, max_workers: 1, num_rounds: 2 } }));
  const jobRow = page.locator(`#jobs-table tr[data-job-id="${job.id}"]`);
  await jobRow.waitFor();
  assert.match(await jobRow.textContent(), /followed-live/);
  await waitFor('the job to run', async () => (await statusOf(jobRow)) === 'running');
  await call('POST', `/training-jobs/${job.id}/cancel`);
  await waitFor('the row to show the cancel', async () => (await statusOf(jobRow)) === 'cancelled');
  assert.notEqual(await jobRow.locator('td').nth(5).textContent(), '—');  // its finish time
  await pause(4500);  // longer than the 2 s the page used to re-read its list every
  assert.equal(listReads['/api/v1/training-jobs'], 1);
  assert.equal(await page.evaluate(() => window.parsynNoReload), true);

  await page.goto(`${base}/#/workers`);
  await page.locator('#workers-table').waitFor();
  await waitFor('the first read of the workers list', () => listReads['/api/v1/workers'] === 1);
  const worker = await call('POST', '/workers', JSON.stringify({ name: 'live-worker', kind: 'own' }));
  const workerRow = page.locator(`#workers-table tr[data-worker-id="${worker.id}"]`);
  await workerRow.waitFor();
  assert.equal(await statusOf(workerRow), 'offline');
  const asWorker = async (route, body) => {
    const r = await fetch(`${base}/api/v1/worker/${route}`, { method: 'POST', body: JSON.stringify(body),
      headers: { Authorization: `Bearer ${worker.token}`, 'Content-Type': 'application/json' } });
    assert.ok(r.ok, `${route}: ${r.status}`);
    return r.status === 204 ? null : r.json();
  };
  const hello = await asWorker('hello', { device: 'cuda:7' });
  await waitFor('the row to show the worker online', async () => (await statusOf(workerRow)) === 'online');
  assert.match(await workerRow.textContent(), /cuda:7/);
  await asWorker('goodbye', { session_id: hello.session_id });
  await waitFor('the row to show the worker offline', async () => (await statusOf(workerRow)) === 'offline');
  await pause(4500);  // longer than the 3 s the page used to re-read its list every
  assert.equal(listReads['/api/v1/workers'], 1);
  assert.equal(await page.evaluate(() => window.parsynNoReload), true);
  assert.ok(streams >= 2, `each page followed /api/v1/events (${streams} streams)`);
  console.log(`live lists: job ${job.id} and worker ${worker.id} changed their rows, each list read once`);
}

await runTest(main, children, tmp);
