// A worker's GPU telemetry end to end, on a machine without an NVIDIA GPU: the stand-in libnvidia-ml
// (src/worker/testing/stand_in_nvml.cc, utilisation 73 %, 12 of 80 GiB in use) is loaded by a real `parsyn worker
// --device cuda:0` through PARSYN_NVML_LIBRARY; its trainer is examples/trainers/pytorch_tabular.py (which trains on
// the CPU where torch has no CUDA). Its progress reports must reach the API's worker_progress events as
// utilization_device "gpu" with the memory, and the dashboard's worker card must label them "GPU utilisation".
//
//   node gpu_worker_test.mjs --parsyn build/src/cli/parsyn --nvml build/src/worker/libnvidia-ml-stand-in.so \
//       --examples examples/trainers --out build/web-screenshots
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  arg, Children, launchChromium, log, playwrightOrSkip, signIn, startServer, uploadModel, waitFor,
} from './harness.mjs';

const { chromium } = await playwrightOrSkip();
const here = path.dirname(fileURLToPath(import.meta.url));
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const NVML = path.resolve(arg('nvml', 'build/src/worker/libnvidia-ml-stand-in.so'));
const EXAMPLES = path.resolve(arg('examples', path.join(here, '..', '..', 'examples', 'trainers')));
const OUT = path.resolve(arg('out', 'web-screenshots'));
fs.mkdirSync(OUT, { recursive: true });

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-gpu-'));
const children = new Children(PARSYN, tmp);
const GIB = 2 ** 30;

// x1,x2 in [-1, 1) and label x1 + x2 > 0: rows a small MLP separates.
function writeSeparableCsv(file, rows) {
  let state = 12345;
  const next = () => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return (state / 2147483648) * 2 - 1;
  };
  const lines = ['x1,x2,label'];
  for (let i = 0; i < rows; i += 1) {
    const x1 = next();
    const x2 = next();
    lines.push(`${x1.toFixed(4)},${x2.toFixed(4)},${x1 + x2 > 0 ? 1 : 0}`);
  }
  fs.writeFileSync(file, `${lines.join('\n')}\n`);
}

// The job's events from its SSE stream, read to the stream's end (the job's terminal status).
async function jobEvents(base, key, jobId) {
  const r = await fetch(`${base}/api/v1/training-jobs/${jobId}/events?after=0`, { headers: { Authorization: `Bearer ${key}` } });
  assert.equal(r.status, 200);
  const events = [];
  for (const block of (await r.text()).split('\n\n')) {
    const type = /^event: (.*)$/m.exec(block)?.[1];
    const data = /^data: (.*)$/m.exec(block)?.[1];
    if (type && data) events.push({ type, data: JSON.parse(data) });
  }
  return events;
}

async function main() {
  writeSeparableCsv(path.join(tmp, 'points.csv'), 400);
  execFileSync(PARSYN, ['model', 'init', '--architecture', 'mlp', '--data', path.join(tmp, 'points.csv'),
    '--hidden-sizes', '8', '--out', path.join(tmp, 'model'), '--seed', '3'], { stdio: 'pipe' });
  const { base, key, call } = await startServer(children, path.join(tmp, 'server'),
    ['--heartbeat-interval-ms', '300', '--heartbeat-timeout-ms', '3000', '--max-poll-wait-ms', '2000']);
  const model = await uploadModel(call, path.join(tmp, 'model'), 'points-mlp');
  const dataset = await call('POST', '/datasets?name=points.csv', fs.readFileSync(path.join(tmp, 'points.csv')),
    'application/octet-stream');
  const worker = await call('POST', '/workers', JSON.stringify({ name: 'gpu-box', kind: 'own' }));
  children.start('worker', ['worker', '--server', base, '--token', worker.token, '--name', 'gpu-box', '--device', 'cuda:0',
    '--cache-dir', path.join(tmp, 'cache'), '--trainer',
    `builtin=/usr/bin/python3 ${path.join(EXAMPLES, 'pytorch_tabular.py')}`], {
    PARSYN_NVML_LIBRARY: NVML,
    PARSYN_STAND_IN_NVML_UTILIZATION: '73',
    PARSYN_STAND_IN_NVML_MEMORY_USED: String(12 * GIB),
    PARSYN_STAND_IN_NVML_MEMORY_TOTAL: String(80 * GIB),
  });
  await waitFor('the worker online', async () => (await call('GET', `/workers/${worker.id}`)).status !== 'offline',
    60_000, 250);
  const job = await call('POST', '/training-jobs', JSON.stringify({
    name: 'gpu-telemetry', dataset_id: dataset.id, model_id: model.id,
    config: { use_peft: false, batch_size: 16, learning_rate: 0.01, label_column: 'label' },
    distributed: { enabled: true, num_rounds: 2, steps_per_round: 20, min_workers: 1, max_workers: 1 },
    worker_selection: { mode: 'own', worker_ids: [worker.id] },
  }));
  log(`job ${job.id} created`);
  const ended = await waitFor('the job to end', async () => {
    const j = await call('GET', `/training-jobs/${job.id}`);
    return ['succeeded', 'failed', 'stopped', 'cancelled'].includes(j.status) && j;
  }, 240_000, 500);
  assert.equal(ended.status, 'succeeded', JSON.stringify(ended));

  // Through the protocol to the API: the worker's reports say the GPU, with NVML's numbers.
  const progress = (await jobEvents(base, key, job.id)).filter((e) => e.type === 'worker_progress').map((e) => e.data);
  const gpu = progress.filter((p) => p.utilization_device === 'gpu');
  assert.ok(gpu.length > 0, `no worker_progress event says gpu: ${JSON.stringify(progress.slice(0, 3))}`);
  // Every report carries the device's sample, the final step's too (the dashboard shows the latest).
  assert.equal(gpu.length, progress.length, `reports without the GPU: ${JSON.stringify(progress.filter(
    (p) => p.utilization_device !== 'gpu'))}`);
  assert.equal(gpu[0].utilization, 0.73);
  assert.equal(gpu[0].device_memory_used_bytes, 12 * GIB);
  assert.equal(gpu[0].device_memory_total_bytes, 80 * GIB);
  log(`${gpu.length} of ${progress.length} progress events report the GPU: ${JSON.stringify(gpu[0])}`);
  const workers = await call('GET', '/workers');
  const shown = workers.workers.find((w) => w.id === worker.id);
  assert.equal(shown.device, 'cuda:0');
  assert.deepEqual(shown.trainers.map((t) => t.name), ['builtin']);
  assert.deepEqual(shown.trainers[0].describe.model_kinds, ['tabular-mlp', 'tabular-logreg']);

  // To the dashboard: the worker's card labels the figure as the GPU's and shows its memory; the job says its trainer.
  const context = await launchChromium(chromium, tmp, { width: 1280, height: 900 });
  try {
    const page = context.pages()[0] ?? await context.newPage();
    await signIn(page, base, key);
    await page.goto(`${base}/#/jobs/${job.id}`);
    const card = page.locator('.worker-card').first();
    await card.waitFor();
    await waitFor('the card to show the GPU', async () =>
      (await card.locator('.stat-utilization-label').textContent()) === 'GPU utilisation', 30_000);
    assert.equal(await card.locator('.stat-utilization').textContent(), '73 %');
    assert.equal(await card.locator('.stat-memory').textContent(), '12.0 / 80.0 GiB');
    assert.match(await card.locator('.stat-trainer').textContent(), /^builtin \(pytorch-tabular/);
    assert.equal(await page.locator('#job-trainer').textContent(), 'Trainer: builtin');
    await page.screenshot({ path: path.join(OUT, 'gpu-worker-card.png'), fullPage: true });
    await page.goto(`${base}/#/workers`);
    await page.locator(`#workers-table tr[data-worker-id="${worker.id}"] .worker-trainers .chip`).waitFor();
    assert.equal(await page.locator(`#workers-table tr[data-worker-id="${worker.id}"] .worker-trainers`).textContent(),
      'builtin');
    log('dashboard: GPU utilisation 73 %, 12.0 / 80.0 GiB, trainer builtin');
  } finally {
    await context.close();
  }
}

let failed = false;
try {
  await main();
  log('PASS');
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error.stack ?? error}`);
  children.dumpLogs();
} finally {
  await children.stopAll();
  if (!failed) fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
