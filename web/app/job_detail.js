// Job detail view, live from the job's events stream: the stream replays every stored event from the first, so the
// page is built by the same code path whether the job ended long ago or is running now. The round history table is
// re-read from /rounds when a round ends; everything else follows the events.
//
// The state and its rules (the final evaluation is never a round above total_rounds, worker cards, "validation loss
// after round r") are job_state.js's: a pure reducer fed every answer and event. This module reads the API, feeds
// the reducer, re-reads what reloadsFor() names, and draws the state at most once a frame.
import { api, download, followJobEvents, listAll } from './api.js';
import { h, fmtDuration, fmtBytes, statusBadge, progressBar, TERMINAL, coalescedRunner } from './dom.js';
import { LineChart, fmtNumber } from './charts.js';
/**
 * @typedef {import('./job_state.js').JobAction} JobAction
 * @typedef {import('./job_state.js').WorkerView} WorkerView
 * @typedef {import('./job_state.js').Round} Round
 * @typedef {import('./job_state.js').Shard} Shard
 */
import {
  initialJobState, reduceJob, reloadsFor, workerName as nameOf, isAsyncJob, isDpJob, isSecureJob, roundRows, roundCounter,
  stalenessHistogram, updatesPerHour, versionTimeline, workerGroups,
  lossSeries, lossSummary as lossNumbers, workerStatus, trainerOf, jobWarnings, isNumber,
} from './job_state.js';

/** @param {HTMLElement} container @param {string[]} params the job's id */
export function render(container, [idText]) {
  const jobId = Number(idText);
  let state = initialJobState(jobId);
  const workerName = (/** @type {number} */ id) => nameOf(state, id);

  // ---- static layout ----
  const title = h('h1', {}, `Training job #${jobId}`);
  const statusSlot = h('span', { id: 'job-status' });
  const liveSlot = h('span', { class: 'live muted', id: 'live-indicator', role: 'status' }, 'Connecting…');
  const stopButton = h('button', { type: 'button', id: 'stop-job' }, 'Stop');
  const cancelButton = h('button', { type: 'button', id: 'cancel-job', class: 'danger' }, 'Cancel');
  const actionMessage = h('p', { class: 'field-error', role: 'alert', id: 'action-message' });
  const roundText = h('strong', { id: 'round-counter' }, '—');
  const roundBar = h('div', { id: 'round-bar' });
  const reasonText = h('p', { class: 'muted', id: 'job-reason' });
  const trainerText = h('p', { class: 'muted', id: 'job-trainer' });
  const secureText = h('p', { class: 'muted', id: 'job-secure' });
  // Asynchronous jobs: the buffer's staleness histogram and each worker's updates per hour (drawn with the rounds).
  const asyncDetails = h('div');
  const timelineBox = h('div', { id: 'version-timeline' });
  const asyncBox = h('section', { class: 'card', id: 'job-async', 'aria-labelledby': 'async-h', hidden: true },
    h('h2', { id: 'async-h' }, 'Asynchronous versions'), asyncDetails,
    h('h3', {}, 'Versions over time'), timelineBox);
  /** @type {LineChart | null} */
  let timelineChart = null;
  const warningsBox = h('section', { class: 'notice', id: 'job-warnings', role: 'note', 'aria-labelledby': 'warnings-h',
                                     hidden: true });
  const lossSummary = h('p', { id: 'loss-summary' });
  const lists = {
    training: h('ul', { class: 'chips', id: 'training-list', 'aria-label': 'Still training' }),
    reported: h('ul', { class: 'chips', id: 'reported-list', 'aria-label': 'Reported' }),
    dropped: h('ul', { class: 'chips', id: 'dropped-list', 'aria-label': 'Dropped' }),
  };
  const workerCards = h('div', { class: 'worker-cards', id: 'worker-cards' });
  const aggregateChartBox = h('div', { id: 'aggregate-chart' });
  const roundsBody = h('tbody');
  const shardsBox = h('section', { class: 'card', id: 'job-shards', 'aria-labelledby': 'shards-h', hidden: true });
  const ROUND_COLUMNS = ['Round', 'Outcome', 'Participants', 'Dropped', 'Duration', 'Bytes down', 'Bytes up', 'Compression',
    'Train loss', 'Validation loss after round'];
  const roundsHead = h('tr', {}, ...ROUND_COLUMNS.map((t) => h('th', { scope: 'col' }, t)));
  const artifactsBox = h('div', { id: 'artifacts' }, h('p', { class: 'muted' }, 'The result can be downloaded once a round has been committed and the job has ended.'));

  container.append(
    h('div', { class: 'page-head' }, h('div', {}, h('a', { href: '#/training', class: 'muted' }, '← Training'), title),
      h('div', { class: 'head-actions' }, statusSlot, liveSlot, stopButton, cancelButton)),
    actionMessage,
    warningsBox,
    h('section', { class: 'card', 'aria-labelledby': 'progress-h' },
      h('h2', { id: 'progress-h' }, 'Progress'),
      h('p', { class: 'round-line' }, 'Round ', roundText), roundBar, reasonText, trainerText, secureText,
      h('div', { class: 'state-lists' },
        h('div', {}, h('h3', {}, 'Training'), lists.training),
        h('div', {}, h('h3', {}, 'Reported'), lists.reported),
        h('div', {}, h('h3', {}, 'Dropped'), lists.dropped))),
    h('section', { class: 'card', 'aria-labelledby': 'aggregate-h' },
      h('h2', { id: 'aggregate-h' }, 'Loss per round'),
      h('p', { class: 'muted' }, 'Aggregated training loss of each committed round; validation loss of the global model ' +
        'after each round (x = 0: the starting weights; x = r: the global that round r committed).'),
      lossSummary,
      aggregateChartBox),
    h('section', { 'aria-labelledby': 'workers-h' }, h('h2', { id: 'workers-h' }, 'Workers'), workerCards),
    shardsBox,
    asyncBox,
    h('section', { class: 'card', 'aria-labelledby': 'rounds-h' },
      h('h2', { id: 'rounds-h' }, 'Round history'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'rounds-table' },
        h('thead', {}, roundsHead),
        roundsBody))),
    h('section', { class: 'card', 'aria-labelledby': 'result-h' }, h('h2', { id: 'result-h' }, 'Result'), artifactsBox),
  );

  const aggregateChart = new LineChart(aggregateChartBox, {
    xLabel: 'round', yLabel: 'loss', height: 220,
    series: [{ label: 'training loss (aggregated)', colorIndex: 0 }, { label: 'validation loss after round', colorIndex: 1 }],
  });
  /**
   * Worker id -> its card: the element, its loss chart, the fields drawn into, and how many loss points the chart has.
   * @type {Map<number, {root: HTMLElement, chart: LineChart, fields: Record<string, HTMLElement>, drawnPoints: number}>}
   */
  const cards = new Map();

  // ---- controls ----
  /** @param {'stop' | 'cancel'} action */
  async function control(action) {
    actionMessage.textContent = '';
    stopButton.disabled = cancelButton.disabled = true;
    try {
      await api('POST', `/training-jobs/${jobId}/${action}`);
    } catch (err) {
      actionMessage.textContent = `Could not ${action} the job: ${/** @type {Error} */ (err).message}`;
      updateButtons();
    }
  }
  stopButton.addEventListener('click', () => control('stop'));
  cancelButton.addEventListener('click', () => {
    if (confirm('Cancel this job? The rounds done so far are kept but no result is published.')) control('cancel');
  });
  function updateButtons() {
    const over = TERMINAL.has(state.status);
    stopButton.disabled = cancelButton.disabled = over;
    stopButton.title = 'Stop after the current round and publish the last committed model';
  }

  // ---- data loading ----
  let stopped = false;
  // The new state after `action`, drawn on the next frame; what it calls for is re-read.
  /** @param {JobAction} action */
  function dispatch(action) {
    const reloads = reloadsFor(state, action);
    state = reduceJob(state, action);
    if (action.type === 'job') applyJob();
    if (reloads.includes('workers')) loadWorkers();
    if (reloads.includes('job')) loadJob();
    if (reloads.includes('rounds')) roundsReload.request();
    if (reloads.includes('artifacts')) loadArtifacts();
    schedule();
  }
  // The workers' names and real states (online, busy and with which job, offline), re-read every 3 s.
  const WORKERS_REFRESH_MS = 3000;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let workersTimer = undefined;
  async function loadWorkers() {
    clearTimeout(workersTimer);
    try {
      const { workers } = await listAll('/workers', 'workers');
      if (stopped) return;
      dispatch({ type: 'workers', workers });
    } catch {
      // Workers show by id, without their state, until the next read.
    }
    if (!stopped) workersTimer = setTimeout(loadWorkers, WORKERS_REFRESH_MS);
  }
  // The job's own fields (final and best validation loss, warnings) change when it ends.
  async function loadJob() {
    try {
      const job = await api('GET', `/training-jobs/${jobId}`);
      if (stopped) return;
      dispatch({ type: 'job', job });
    } catch {
      // Kept as it was.
    }
  }
  // What the job's own fields show: its trainer, warnings and shards.
  function applyJob() {
    const job = /** @type {import('./job_state.js').Job} */ (state.job);
    // The trainer the job names (docs/trainer-contract.md): only workers offering it take its tasks.
    const trainer = job.spec?.config?.trainer;
    trainerText.textContent = trainer ? `Trainer: ${trainer}` : '';
    // distributed.secure_aggregation (docs/secure-aggregation.md): the coordinator sees each round's sum only.
    secureText.textContent = job.spec?.distributed?.secure_aggregation?.enabled
      ? 'Securely aggregated: the coordinator sees only each round\'s sum of the survivors\' updates (the accepted ones)'
      : '';
    const warnings = jobWarnings(state);
    warningsBox.hidden = warnings.length === 0;
    warningsBox.replaceChildren(h('h2', { id: 'warnings-h' }, 'Warnings'),
      h('ul', {}, ...warnings.map((w) => h('li', {}, w))));
    renderShards(Array.isArray(job.shards) ? job.shards : []);
  }
  // The data partition: each shard's training samples per label, as numbers and as a stacked bar.
  /** @param {Shard[]} shards */
  function renderShards(shards) {
    shardsBox.hidden = shards.length === 0;
    if (shards.length === 0) return;
    const labels = [...new Set(shards.flatMap((s) => Object.keys(s.label_histogram ?? {})))];
    const numeric = labels.every((l) => /^-?\d+$/.test(l));
    labels.sort((a, b) => (numeric ? Number(a) - Number(b) : a < b ? -1 : a > b ? 1 : 0));
    const colour = (/** @type {number} */ i) => `hsl(${Math.round((i * 360) / Math.max(labels.length, 1))} 60% 55%)`;
    const partition = state.job?.spec?.distributed?.partition ?? { method: 'iid' };
    const settings = Object.entries(partition).filter(([k]) => k !== 'method').map(([k, v]) => `${k} ${v}`).join(', ');
    shardsBox.replaceChildren(h('h2', { id: 'shards-h' }, 'Data partition'),
      h('p', { class: 'muted', id: 'partition-method' }, `Method ${partition.method}${settings ? ` (${settings})` : ''}; ` +
        'training samples of each label per shard.'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'shards-table' },
        h('thead', {}, h('tr', {}, ...['Shard', 'Worker', 'Training samples', 'Labels', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, ...shards.map((s) => {
          const histogram = s.label_histogram ?? null;
          const total = s.train_samples || 1;
          const bar = h('div', { class: 'histogram-bar', role: 'img',
            'aria-label': histogram ? labels.map((l) => `${l}: ${histogram[l] ?? 0}`).join(', ') : 'no labels counted' },
          ...(histogram ? labels.filter((l) => histogram[l]).map((l) => h('span', {
            title: `${l}: ${histogram[l]}`, style: `width: ${(100 * histogram[l]) / total}%; background: ${colour(labels.indexOf(l))}` })) : []));
          return h('tr', { dataset: { shard: s.shard } },
            h('td', {}, String(s.shard)),
            h('td', {}, s.worker_id == null ? '—' : (state.names.get(s.worker_id) ?? `#${s.worker_id}`)),
            h('td', {}, String(s.train_samples)),
            h('td', { class: 'histogram-text' }, histogram ? labels.filter((l) => histogram[l]).map((l) => `${l}: ${histogram[l]}`).join(', ') : '—'),
            h('td', { class: 'histogram-cell' }, bar));
        })))));
  }
  // Re-read at most every 200 ms however fast rounds end: one read for a burst of round ends.
  const roundsReload = coalescedRunner(() => { loadRounds(); }, 200);
  async function loadRounds() {
    try {
      const { rounds } = await api('GET', `/training-jobs/${jobId}/rounds`);
      if (stopped) return;
      state = reduceJob(state, { type: 'rounds', rounds });
      drawRounds();
      schedule();
    } catch {
      // Kept as it was; the next round's end reads it again.
    }
  }
  async function loadArtifacts() {
    try {
      const { artifacts } = await api('GET', `/training-jobs/${jobId}/artifacts`);
      if (stopped || !artifacts.length) return;
      artifactsBox.replaceChildren(h('ul', { class: 'artifacts' }, ...artifacts.map((/** @type {{name: string, size_bytes: number}} */ a) => h('li', {},
        h('button', { type: 'button', class: 'primary', dataset: { artifact: a.name },
                      onclick: () => download(`/training-jobs/${jobId}/artifacts/${encodeURIComponent(a.name)}`, a.name)
                        .catch((/** @type {Error} */ err) => { actionMessage.textContent = `Download failed: ${err.message}`; }) },
          `Download ${a.name}`),
        h('span', { class: 'muted' }, ` ${fmtBytes(a.size_bytes)}`)))));
    } catch {
      // Left as "not yet".
    }
  }

  /** @param {Round} r */
  function privacyCell(r) {
    const p = r.privacy;
    if (!p) return h('td', { class: 'privacy-epsilon' }, '—');
    const epsilon = p.epsilon === null ? '∞' : fmtNumber(p.epsilon);
    const title = `δ ${p.delta}; ${p.clipped} of ${p.participants} updates clipped to ${p.clip_norm}; ` +
      `noise stddev ${fmtNumber(p.noise_stddev)}; sampling rate ${fmtNumber(p.sampling_rate)}`;
    return h('td', { class: 'privacy-epsilon', title }, epsilon);
  }

  /** @param {Round} r */
  function survivorsCell(r) {
    const s = r.secure_aggregation;
    if (!s) return h('td', { class: 'secure-survivors' }, '—');
    const names = (/** @type {number[]} */ ids) => ids.map((id) => workerName(id)).join(', ') || 'none';
    const title = `advertised keys: ${names(s.advertised)}; shared them: ${names(s.shared)}; ` +
      `summed: ${names(s.masked)}; revealed shares: ${names(s.revealed)}` + (s.failure ? `; failed: ${s.failure}` : '');
    return h('td', { class: 'secure-survivors', title, dataset: { survivors: s.masked.join(',') } },
      `${s.masked.length} of ${s.participants.length}: ${names(s.masked)}`);
  }

  /** @param {Round} r */
  function stalenessCell(r) {
    const accepted = (r.updates ?? []).filter((u) => u.status === 'accepted' && typeof u.staleness === 'number');
    if (!accepted.length) return h('td', { class: 'update-staleness' }, '—');
    const title = accepted.map((u) => `${workerName(u.worker_id)}: trained on version ${u.trained_on_round}`).join('; ');
    return h('td', { class: 'update-staleness', title, dataset: { staleness: accepted.map((u) => u.staleness).join(',') } },
      accepted.map((u) => u.staleness).join(', '));
  }

  // Asynchronous jobs: how stale the buffered updates were, and how often each worker's update counted.
  function drawAsync() {
    const spec = state.job?.spec?.distributed?.async;
    asyncBox.hidden = !isAsyncJob(state);
    if (asyncBox.hidden) return;
    const histogram = stalenessHistogram(state);
    const most = Math.max(1, ...histogram.map(([, n]) => n));
    timelineChart ??= new LineChart(timelineBox, {
      xLabel: 'seconds since the first version started', yLabel: 'version', height: 160,
      series: [{ label: 'version committed', colorIndex: 2 }],
    });
    const timeline = versionTimeline(state);
    timelineChart.setData(timeline.seconds, [timeline.versions]);
    asyncDetails.replaceChildren(
      h('p', { class: 'muted' }, spec
        ? `Each version is made from ${spec.buffer_size} accepted updates; an update may lag at most ` +
          `${spec.max_staleness} versions (its staleness: versions committed since the one it trained on).`
        : 'Each version is made from a buffer of accepted updates.'),
      h('h3', {}, 'Staleness of the accepted updates'),
      histogram.length
        ? h('ul', { class: 'plain staleness-histogram' }, ...histogram.map(([staleness, n]) =>
          h('li', { dataset: { staleness, count: n } },
            h('span', {}, `${staleness}`),
            h('div', { class: 'histogram-bar', role: 'img', 'aria-label': `${n} updates of staleness ${staleness}` },
              h('span', { style: `width: ${(100 * n) / most}%; background: var(--accent)` })),
            h('span', { class: 'muted' }, `${n}`))))
        : h('p', { class: 'muted' }, 'No version committed yet.'),
      h('h3', {}, 'Updates per worker'),
      h('ul', { class: 'plain updates-per-hour' }, ...updatesPerHour(state).map(({ worker, updates, perHour }) =>
        h('li', { dataset: { workerId: worker, updates } }, workerName(worker), h('span', { class: 'muted' },
          `: ${updates} accepted` + (perHour === null ? '' : `, ${fmtNumber(perHour, 3)} an hour`))))));
  }

  function drawRounds() {
    drawAsync();
    const privacy = isDpJob(state);
    const secure = isSecureJob(state);
    const asynchronous = isAsyncJob(state);
    const extra = [...(asynchronous ? ['Staleness'] : []), ...(secure ? ['Survivors'] : []),
      ...(privacy ? ['Privacy ε'] : [])];
    roundsHead.replaceChildren(...[...ROUND_COLUMNS, ...extra].map((t) => h('th', { scope: 'col' }, t)));
    roundsBody.replaceChildren(...roundRows(state).map(({ round: r, label, finalEvaluation, outcome, participants, dropped, validation, isBest }) => {
      /** @type {Record<string, string | number>} */
      const dataset = { round: r.round, attempt: r.attempt, outcome: finalEvaluation ? 'final_evaluation' : r.outcome };
      if (isBest) dataset.best = 'true';
      return h('tr', { dataset, class: isBest ? 'best-round' : null },
        h('th', { scope: 'row' }, label, isBest ? h('span', { class: 'status status-best' }, 'best') : null),
        h('td', {}, finalEvaluation ? statusBadge(outcome)
          : [statusBadge(outcome), r.failure_reason ? h('span', { class: 'muted' }, ` ${r.failure_reason}`) : null]),
        h('td', { class: 'participants' }, participants.map((id) => workerName(id)).join(', ') || '—'),
        h('td', { class: 'dropped' }, dropped.length
          ? h('ul', { class: 'plain' }, ...dropped.map(([id, why]) => h('li', { dataset: { workerId: id } },
            workerName(id), why ? h('span', { class: 'muted' }, `: ${why}`) : null)))
          : '—'),
        h('td', {}, fmtDuration(r.duration_ms)),
        // The job's blobs down to the workers and up from them; rounds recorded before the split show their total only.
        h('td', { class: 'bytes-down', title: `${fmtBytes(r.bytes_moved)} in all` }, fmtBytes(r.bytes_down)),
        h('td', { class: 'bytes-up', title: `${fmtBytes(r.bytes_moved)} in all` }, fmtBytes(r.bytes_up)),
        // The updates' plain size over their wire size (distributed.compression; 1.00× without).
        h('td', { class: 'compression-ratio' }, typeof r.compression_ratio === 'number' ? `${r.compression_ratio.toFixed(2)}×` : '—'),
        h('td', {}, fmtNumber(r.train_loss)),
        h('td', { class: 'validation-after' }, finalEvaluation ? '—' : fmtNumber(validation)),
        asynchronous ? stalenessCell(r) : null,
        secure ? survivorsCell(r) : null,
        privacy ? privacyCell(r) : null);
    }));
    if (!state.rounds.length) {
      roundsBody.replaceChildren(h('tr', {}, h('td', { colspan: ROUND_COLUMNS.length + extra.length, class: 'muted' }, 'No rounds yet.')));
    }
  }

  // ---- events ----
  /** @param {string} type @param {import('./job_state.js').JobEvent} e */
  function onEvent(type, e) {
    dispatch({ type: 'event', name: type, data: e });
  }

  // ---- rendering (at most once per frame) ----
  let pending = false;
  function schedule() {
    if (pending || stopped) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (!stopped) draw();
    });
  }

  function draw() {
    statusSlot.replaceChildren(statusBadge(state.status));
    const total = state.totalRounds;
    const counter = roundCounter(state);
    roundText.textContent = counter.text;
    roundText.dataset.phase = counter.phase;
    roundBar.replaceChildren(progressBar(state.committed ?? 0, total, `${state.committed ?? 0} of ${total} rounds committed`));
    reasonText.textContent = state.reason ? `Reason: ${state.reason}` : '';
    if (TERMINAL.has(state.status)) {
      liveSlot.textContent = 'Ended';
      liveSlot.classList.remove('is-live');
    }
    updateButtons();

    for (const [group, members] of Object.entries(workerGroups(state))) {
      lists[/** @type {keyof typeof lists} */ (group)].replaceChildren(...(members.length
        ? members.map((w) => h('li', { dataset: { workerId: w.id }, title: w.reason || null },
          workerName(w.id), w.reason ? h('span', { class: 'muted' }, ` (${w.reason})`) : null))
        : [h('li', { class: 'muted empty' }, 'none')]));
    }

    const series = lossSeries(state);
    aggregateChart.setData(series.rounds, [series.train, series.validation]);
    aggregateChartBox.dataset.validation = JSON.stringify(Object.fromEntries([...state.validation].sort((a, b) => a[0] - b[0])));
    drawLossSummary();
    drawRounds();

    let index = 0;
    for (const w of state.workers.values()) drawWorker(w, index++);
  }

  function drawLossSummary() {
    const { initial, result, best, bestLoss } = lossNumbers(state);
    const parts = [];
    if (isNumber(initial)) parts.push(`starting weights ${fmtNumber(initial)}`);
    if (isNumber(result)) parts.push(`after round ${state.committed} (the result) ${fmtNumber(result)}`);
    if (best !== null) parts.push(`best after round ${best} ${fmtNumber(bestLoss)}`);
    lossSummary.textContent = parts.length ? `Validation loss: ${parts.join('; ')}.` : '';
    lossSummary.dataset.bestRound = String(best ?? '');
  }

  /** @param {string | null} device */
  function utilizationLabel(device) {
    if (device === 'gpu') return 'GPU utilisation';
    if (device === 'host_cpu') return 'Host CPU (whole machine)';
    return 'Utilisation (device not reported)';
  }

  /** @param {WorkerView} w @param {number} index its place among the cards (its chart's colour) */
  function drawWorker(w, index) {
    let card = cards.get(w.id);
    if (!card) {
      const fields = {
        state: h('span'), progress: h('div'), task: h('p', { class: 'worker-task' }), device: h('span'),
        loss: h('span'), throughput: h('span', { class: 'stat-throughput' }), utilization: h('span', { class: 'stat-utilization' }),
        utilizationLabel: h('dt', { class: 'stat-utilization-label' }, 'Utilisation'),
        memory: h('span', { class: 'stat-memory' }), trainer: h('span', { class: 'stat-trainer' }),
        rank: h('span', { class: 'stat-lora-rank' }),
      };
      const chartBox = h('div', { class: 'worker-chart', dataset: { workerId: w.id } });
      const root = h('article', { class: 'card worker-card', dataset: { workerId: w.id } },
        h('h3', {}, h('span', { class: 'worker-name' }, workerName(w.id)), ' ', fields.state),
        fields.task, fields.progress,
        h('dl', { class: 'stats' },
          h('dt', {}, 'Device'), h('dd', {}, fields.device),
          h('dt', {}, 'Trainer'), h('dd', {}, fields.trainer),
          h('dt', {}, 'LoRA rank'), h('dd', {}, fields.rank),
          h('dt', {}, 'Loss'), h('dd', {}, fields.loss),
          h('dt', {}, 'Throughput'), h('dd', {}, fields.throughput),
          fields.utilizationLabel, h('dd', {}, fields.utilization),
          h('dt', {}, 'GPU memory'), h('dd', {}, fields.memory)),
        chartBox);
      workerCards.append(root);
      const chart = new LineChart(chartBox, { xLabel: 'step', yLabel: 'loss', height: 160,
                                              series: [{ label: 'loss', colorIndex: index }] });
      card = { root, chart, fields, drawnPoints: -1 };
      cards.set(w.id, card);
    }
    /** @type {HTMLElement} */ (card.root.querySelector('.worker-name')).textContent = workerName(w.id);
    const shown = workerStatus(state, w);
    card.root.dataset.state = shown.badge;
    card.fields.state.replaceChildren(statusBadge(shown.badge));
    card.fields.task.replaceChildren(shown.text,
      ...(shown.link ? [' (', h('a', { href: `#/jobs/${shown.link}` }, `#${shown.link}`), ')'] : []));
    card.fields.progress.replaceChildren(...(shown.showProgress
      ? [progressBar(w.step, shown.of || 0, `${workerName(w.id)}: step ${w.step} of ${shown.of}`)] : []));
    card.fields.device.textContent = state.workerInfo.get(w.id)?.device || '—';
    card.fields.loss.textContent = fmtNumber(w.loss);
    // tokens/s for language models, samples/s otherwise, as the worker names it.
    card.fields.throughput.textContent = w.throughput === null ? '—'
      : `${fmtNumber(w.throughput, 3)} ${w.throughputUnit ?? 'per second (unit not reported)'}`;
    card.fields.utilizationLabel.textContent = utilizationLabel(w.utilizationDevice);
    card.fields.utilization.textContent = w.utilization === null ? '—' : `${Math.round(w.utilization * 100)} %`;
    card.fields.memory.textContent = w.memoryTotal === null ? '—'
      : `${(Number(w.memoryUsed) / 2 ** 30).toFixed(1)} / ${(w.memoryTotal / 2 ** 30).toFixed(1)} GiB`;
    card.fields.trainer.textContent = trainerOf(state, w.id);
    card.fields.rank.textContent = w.loraRank === null ? '—' : String(w.loraRank);
    if (card.drawnPoints !== w.losses.length) {
      card.chart.setData(w.xs.slice(), [w.losses.slice()]);
      card.drawnPoints = w.losses.length;
    }
  }

  // ---- start ----
  let stopEvents = () => {};
  (async () => {
    try {
      const job = await api('GET', `/training-jobs/${jobId}`);
      if (stopped) return;
      state = reduceJob(state, { type: 'job', job, first: true });
      applyJob();
      title.textContent = job.name;
      title.append(h('span', { class: 'muted' }, ` #${job.id}`));
      document.title = `${job.name} · Parsyn`;
    } catch (err) {
      actionMessage.textContent = `Could not load training job ${jobId}: ${/** @type {Error} */ (err).message}`;
      liveSlot.textContent = '';
      return;
    }
    await loadWorkers();
    loadRounds();
    loadArtifacts();
    schedule();
    stopEvents = followJobEvents(jobId, onEvent, {
      isDone: () => TERMINAL.has(state.status),
      onConnection: (open, error) => {
        liveSlot.textContent = open ? 'Live' : TERMINAL.has(state.status) ? 'Ended' : error ? `Not live: ${error.message}` : 'Reconnecting…';
        liveSlot.classList.toggle('is-live', open && !TERMINAL.has(state.status));
      },
    });
  })();

  return () => {
    stopped = true;
    stopEvents();
    roundsReload.cancel();
    clearTimeout(workersTimer);
    aggregateChart.destroy();
    for (const card of cards.values()) card.chart.destroy();
  };
}
