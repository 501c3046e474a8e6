// Job detail view, live from the job's events stream: the stream replays every stored event from the first, so the
// page is built by the same code path whether the job ended long ago or is running now. The round history table is
// re-read from /rounds when a round ends; everything else follows the events.
//
// Truthfulness rules:
//   - The coordinator runs the final evaluation as "round" total_rounds + 1: it is shown as the job's final
//     evaluation, never as a round above total_rounds.
//   - A worker card shows the worker's part in this job while the job runs; once the job has ended (or the worker has
//     no task of it), the worker's real state from /workers (idle, busy with another job, offline).
//   - Validation loss is "after round r": the loss of the global that round r committed (x = r on the chart; x = 0 is
//     the starting weights). Table and chart read the same numbers (state.validation).
import { api, download, followJobEvents, listAll } from './api.js';
import { h, fmtTime, fmtDuration, fmtBytes, statusBadge, progressBar, TERMINAL } from './dom.js';
import { LineChart, fmtNumber } from './charts.js';

const isNumber = (v) => typeof v === 'number' && Number.isFinite(v);

export function render(container, [idText]) {
  const jobId = Number(idText);
  const state = {
    job: null,
    status: 'queued',
    reason: '',
    round: 0,
    attempt: 1,
    totalRounds: 0,
    stepsPerRound: 0,
    workers: new Map(),  // worker id -> per-worker view (see workerState)
    names: new Map(),    // worker id -> name
    train: new Map(),    // round -> aggregated training loss
    validation: new Map(),  // r -> validation loss of the global after round r (0: the starting weights)
    committed: 0,        // last committed round
    finalEvaluation: false,  // the job's final evaluation is running (or ran)
    attempts: new Map(),  // "round-attempt" -> {participants: Set of ids, dropped: Map id -> reason}, from the events
    workerInfo: new Map(),  // worker id -> its /workers entry (status, current_job_id, device)
    rounds: [],          // the last /rounds answer
  };
  const isFinalEvaluationRound = (round) => state.totalRounds > 0 && round > state.totalRounds;
  function attemptRecord(round, attempt) {
    const key = `${round}-${attempt}`;
    if (!state.attempts.has(key)) state.attempts.set(key, { participants: new Set(), dropped: new Map() });
    return state.attempts.get(key);
  }

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
  const ROUND_COLUMNS = ['Round', 'Outcome', 'Participants', 'Dropped', 'Duration', 'Bytes', 'Compression',
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
      h('p', { class: 'round-line' }, 'Round ', roundText), roundBar, reasonText, trainerText,
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
  const cards = new Map();  // worker id -> {root, chart, fields}

  // ---- controls ----
  async function control(action) {
    actionMessage.textContent = '';
    stopButton.disabled = cancelButton.disabled = true;
    try {
      await api('POST', `/training-jobs/${jobId}/${action}`);
    } catch (err) {
      actionMessage.textContent = `Could not ${action} the job: ${err.message}`;
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
  // The workers' names and real states (online, busy and with which job, offline), re-read every 3 s.
  const WORKERS_REFRESH_MS = 3000;
  let workersTimer = null;
  async function loadWorkers() {
    clearTimeout(workersTimer);
    try {
      const { workers } = await listAll('/workers', 'workers');
      if (stopped) return;
      for (const w of workers) {
        state.names.set(w.id, w.name);
        state.workerInfo.set(w.id, w);
      }
      schedule();
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
      applyJob(job);
      schedule();
    } catch {
      // Kept as it was.
    }
  }
  function applyJob(job) {
    state.job = job;
    // The trainer the job names (docs/trainer-contract.md): only workers offering it take its tasks.
    const trainer = job.spec?.config?.trainer;
    trainerText.textContent = trainer ? `Trainer: ${trainer}` : '';
    state.totalRounds = job.total_rounds ?? state.totalRounds;
    state.committed = job.committed_round;
    if (job.live?.phase === 'final_evaluation') state.finalEvaluation = true;
    if (isNumber(job.initial_validation_loss)) state.validation.set(0, job.initial_validation_loss);
    if (isNumber(job.final_validation_loss) && state.committed > 0) {
      state.validation.set(state.committed, job.final_validation_loss);
    }
    const warnings = Array.isArray(job.warnings) ? job.warnings : [];
    warningsBox.hidden = warnings.length === 0;
    warningsBox.replaceChildren(h('h2', { id: 'warnings-h' }, 'Warnings'),
      h('ul', {}, ...warnings.map((w) => h('li', {}, w))));
    renderShards(Array.isArray(job.shards) ? job.shards : []);
  }
  // The data partition: each shard's training samples per label, as numbers and as a stacked bar.
  function renderShards(shards) {
    shardsBox.hidden = shards.length === 0;
    if (shards.length === 0) return;
    const labels = [...new Set(shards.flatMap((s) => Object.keys(s.label_histogram ?? {})))];
    const numeric = labels.every((l) => /^-?\d+$/.test(l));
    labels.sort((a, b) => (numeric ? Number(a) - Number(b) : a < b ? -1 : a > b ? 1 : 0));
    const colour = (i) => `hsl(${Math.round((i * 360) / Math.max(labels.length, 1))} 60% 55%)`;
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
  let roundsTimer = null;
  function refreshRoundsSoon() {
    clearTimeout(roundsTimer);
    roundsTimer = setTimeout(loadRounds, 200);
  }
  async function loadRounds() {
    try {
      const { rounds } = await api('GET', `/training-jobs/${jobId}/rounds`);
      if (stopped) return;
      state.rounds = rounds;
      for (const r of rounds) {
        if (r.outcome === 'committed' && isNumber(r.validation_loss)) state.validation.set(r.round, r.validation_loss);
      }
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
      artifactsBox.replaceChildren(h('ul', { class: 'artifacts' }, ...artifacts.map((a) => h('li', {},
        h('button', { type: 'button', class: 'primary', dataset: { artifact: a.name },
                      onclick: () => download(`/training-jobs/${jobId}/artifacts/${encodeURIComponent(a.name)}`, a.name)
                        .catch((err) => { actionMessage.textContent = `Download failed: ${err.message}`; }) },
          `Download ${a.name}`),
        h('span', { class: 'muted' }, ` ${fmtBytes(a.size_bytes)}`)))));
    } catch {
      // Left as "not yet".
    }
  }

  // The best round: the server's (best_round) when it reports one, else the committed round whose global had the
  // lowest validation loss measured so far.
  function bestRound() {
    if (state.job && Object.hasOwn(state.job, 'best_round')) return state.job.best_round ?? null;
    let best = null;
    for (const [r, loss] of state.validation) {
      if (r >= 1 && r <= state.committed && isNumber(loss) && (best === null || loss < state.validation.get(best))) best = r;
    }
    return best;
  }

  // dp_fedavg jobs: the privacy spent, ε at the job's δ after each committed round (all rounds so far), from the
  // round's "privacy" report; its tooltip has the rest of the report.
  function isDpJob() {
    return state.job?.spec?.distributed?.strategy === 'dp_fedavg' || state.rounds.some((r) => r.privacy);
  }

  function privacyCell(r) {
    const p = r.privacy;
    if (!p) return h('td', { class: 'privacy-epsilon' }, '—');
    const epsilon = p.epsilon === null ? '∞' : fmtNumber(p.epsilon);
    const title = `δ ${p.delta}; ${p.clipped} of ${p.participants} updates clipped to ${p.clip_norm}; ` +
      `noise stddev ${fmtNumber(p.noise_stddev)}; sampling rate ${fmtNumber(p.sampling_rate)}`;
    return h('td', { class: 'privacy-epsilon', title }, epsilon);
  }

  function drawRounds() {
    const rounds = state.rounds;
    const privacy = isDpJob();
    roundsHead.replaceChildren(...[...ROUND_COLUMNS, ...(privacy ? ['Privacy ε'] : [])].map((t) => h('th', { scope: 'col' }, t)));
    const best = bestRound();
    roundsBody.replaceChildren(...rounds.map((r) => {
      const finalEvaluation = isFinalEvaluationRound(r.round);
      const fromEvents = state.attempts.get(`${r.round}-${r.attempt}`);
      // Participants: chosen at the start, given a task later, or who sent an update; the dropped ones with why.
      const participants = new Set([...(r.participants ?? []), ...(r.updates ?? []).map((u) => u.worker_id),
        ...(fromEvents?.participants ?? [])]);
      const dropped = new Map(fromEvents?.dropped ?? []);
      for (const d of r.dropped ?? []) dropped.set(d.worker_id, d.reason ?? '');
      for (const u of r.updates ?? []) if (u.status === 'rejected') dropped.set(u.worker_id, `update rejected: ${u.reason ?? ''}`);
      for (const id of dropped.keys()) participants.add(id);
      const validation = r.outcome === 'committed' ? state.validation.get(r.round) : null;
      const isBest = !finalEvaluation && r.outcome === 'committed' && best === r.round;
      const label = finalEvaluation ? 'Final evaluation'
        : r.attempt > 1 ? `${r.round} (attempt ${r.attempt})` : `${r.round}`;
      // The final evaluation's attempt is closed when the job ends; it measured the last global if that loss is known.
      const outcome = finalEvaluation
        ? (state.validation.has(state.committed) && TERMINAL.has(state.status) ? statusBadge('measured') : statusBadge(TERMINAL.has(state.status) ? 'not-measured' : 'running'))
        : [statusBadge(r.outcome), r.failure_reason ? h('span', { class: 'muted' }, ` ${r.failure_reason}`) : null];
      const dataset = { round: r.round, attempt: r.attempt, outcome: finalEvaluation ? 'final_evaluation' : r.outcome };
      if (isBest) dataset.best = 'true';
      return h('tr', { dataset, class: isBest ? 'best-round' : null },
        h('th', { scope: 'row' }, label, isBest ? h('span', { class: 'status status-best' }, 'best') : null),
        h('td', {}, outcome),
        h('td', { class: 'participants' }, [...participants].map((id) => workerName(id)).join(', ') || '—'),
        h('td', { class: 'dropped' }, dropped.size
          ? h('ul', { class: 'plain' }, ...[...dropped].map(([id, why]) => h('li', { dataset: { workerId: id } },
            workerName(id), why ? h('span', { class: 'muted' }, `: ${why}`) : null)))
          : '—'),
        h('td', {}, fmtDuration(r.duration_ms)),
        h('td', {}, fmtBytes(r.bytes_moved)),
        // The updates' plain size over their wire size (distributed.compression; 1.00× without).
        h('td', { class: 'compression-ratio' }, typeof r.compression_ratio === 'number' ? `${r.compression_ratio.toFixed(2)}×` : '—'),
        h('td', {}, fmtNumber(r.train_loss)),
        h('td', { class: 'validation-after' }, finalEvaluation ? '—' : fmtNumber(validation)),
        privacy ? privacyCell(r) : null);
    }));
    if (!rounds.length) {
      roundsBody.replaceChildren(h('tr', {}, h('td', { colspan: ROUND_COLUMNS.length + (privacy ? 1 : 0), class: 'muted' }, 'No rounds yet.')));
    }
  }

  function workerName(id) {
    return state.names.get(id) ?? `worker #${id}`;
  }
  function workerState(id) {
    if (!state.workers.has(id)) {
      state.workers.set(id, { id, state: 'idle', reason: '', round: 0, kind: 'train', step: 0, totalSteps: null,
                              loss: null, throughput: null, throughputUnit: null, utilization: null,
                              memoryUsed: null, memoryTotal: null,
                              utilizationDevice: null, xs: [], losses: [] });
      if (!state.names.has(id)) loadWorkers();
    }
    return state.workers.get(id);
  }

  // ---- events ----
  function onEvent(type, e) {
    switch (type) {
      case 'job_status':
        state.status = e.status;
        state.reason = e.reason ?? '';
        if (e.status === 'running') loadJob();  // its shards (and their label histograms) exist from now on
        if (TERMINAL.has(e.status)) {
          // The job is over: none of its workers trains or evaluates for it any more (cards show their real state).
          for (const w of state.workers.values()) Object.assign(w, { state: 'ended', reason: '' });
          refreshRoundsSoon();
          loadArtifacts();
          loadJob();
        }
        break;
      case 'round_started':
        state.totalRounds = e.total_rounds ?? state.totalRounds;
        for (const w of state.workers.values()) {
          w.state = 'idle';
          w.reason = '';
          w.step = 0;
        }
        if (isFinalEvaluationRound(e.round)) {
          state.finalEvaluation = true;
        } else {
          state.round = e.round;
          state.attempt = e.attempt;
        }
        for (const id of e.participants ?? []) {
          attemptRecord(e.round, e.attempt).participants.add(id);
          const evaluating = isFinalEvaluationRound(e.round);
          Object.assign(workerState(id), { state: evaluating ? 'evaluating' : 'training', kind: evaluating ? 'evaluate' : 'train', round: e.round });
        }
        refreshRoundsSoon();
        break;
      case 'task_assigned':
        // The final evaluation has no round_started: its tasks (kind evaluate, round total_rounds + 1) begin it.
        if (e.kind === 'evaluate' || isFinalEvaluationRound(e.round)) state.finalEvaluation = true;
        attemptRecord(e.round, e.attempt).participants.add(e.worker_id);
        Object.assign(workerState(e.worker_id), {
          state: e.kind === 'evaluate' ? 'evaluating' : 'training', kind: e.kind ?? 'train', round: e.round, step: 0,
          totalSteps: null, reason: '' });
        break;
      case 'worker_progress': {
        const w = workerState(e.worker_id);
        w.round = e.round;
        w.step = e.step;
        w.totalSteps = e.total_steps ?? w.totalSteps;
        if (isNumber(e.throughput)) {
          w.throughput = e.throughput;
          w.throughputUnit = e.throughput_unit ?? null;
        }
        if (isNumber(e.utilization)) {
          w.utilization = e.utilization;
          w.utilizationDevice = e.utilization_device ?? null;
        }
        // A report without a device sample (the worker samples on its own clock) keeps the last one shown.
        if (isNumber(e.device_memory_total_bytes)) {
          w.memoryUsed = isNumber(e.device_memory_used_bytes) ? e.device_memory_used_bytes : null;
          w.memoryTotal = e.device_memory_total_bytes;
        }
        // Loss curves are of training steps; the final evaluation's progress moves the card's counter only.
        if (isNumber(e.loss) && !isFinalEvaluationRound(e.round)) {
          w.loss = e.loss;
          const perRound = state.stepsPerRound || w.totalSteps || 0;
          w.xs.push((e.round - 1) * perRound + e.step);
          w.losses.push(e.loss);
        }
        break;
      }
      case 'update_accepted':
        workerState(e.worker_id).state = 'reported';
        break;
      case 'update_rejected':
        attemptRecord(e.round, e.attempt).dropped.set(e.worker_id, `update rejected: ${e.reason}`);
        Object.assign(workerState(e.worker_id), { state: 'rejected', reason: e.reason });
        refreshRoundsSoon();
        break;
      case 'worker_dropped':
        attemptRecord(e.round, e.attempt).dropped.set(e.worker_id, e.reason || e.cause || '');
        Object.assign(workerState(e.worker_id), { state: 'dropped', reason: e.reason || e.cause });
        refreshRoundsSoon();
        break;
      case 'round_committed':
        state.totalRounds = e.total_rounds ?? state.totalRounds;
        state.committed = e.round;
        // After the last round, the final evaluation runs until the job ends.
        if (state.totalRounds > 0 && e.round >= state.totalRounds) state.finalEvaluation = true;
        if (e.train_loss !== null && e.train_loss !== undefined) state.train.set(e.round, e.train_loss);
        refreshRoundsSoon();
        break;
      case 'global_evaluated':
        // global_round r: the global that round r committed (0: the starting weights).
        if (isNumber(e.validation_loss)) state.validation.set(e.global_round, e.validation_loss);
        break;
      case 'round_failed':
        refreshRoundsSoon();
        break;
      default:
        break;
    }
    schedule();
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
    const over = TERMINAL.has(state.status);
    if (state.finalEvaluation && !over) {
      roundText.textContent = `Final evaluation (after ${state.committed ?? total} of ${total} rounds)`;
    } else if (over) {
      roundText.textContent = `${state.committed ?? 0} of ${total} committed`;
    } else {
      const round = Math.min(state.round, total || state.round);
      roundText.textContent = `${round} of ${total}${state.attempt > 1 ? ` (attempt ${state.attempt})` : ''}`;
    }
    roundText.dataset.phase = over ? 'ended' : state.finalEvaluation ? 'final_evaluation' : 'training';
    roundBar.replaceChildren(progressBar(state.committed ?? 0, total, `${state.committed ?? 0} of ${total} rounds committed`));
    reasonText.textContent = state.reason ? `Reason: ${state.reason}` : '';
    if (TERMINAL.has(state.status)) {
      liveSlot.textContent = 'Ended';
      liveSlot.classList.remove('is-live');
    }
    updateButtons();

    const groups = { training: [], reported: [], dropped: [] };
    for (const w of state.workers.values()) {
      const group = w.state === 'training' || w.state === 'evaluating' ? 'training'
        : w.state === 'reported' ? 'reported' : w.state === 'dropped' || w.state === 'rejected' ? 'dropped' : null;
      if (group) groups[group].push(w);
    }
    for (const [group, members] of Object.entries(groups)) {
      lists[group].replaceChildren(...(members.length
        ? members.map((w) => h('li', { dataset: { workerId: w.id }, title: w.reason || null },
          workerName(w.id), w.reason ? h('span', { class: 'muted' }, ` (${w.reason})`) : null))
        : [h('li', { class: 'muted empty' }, 'none')]));
    }

    const rounds = [...new Set([...state.train.keys(), ...state.validation.keys()])].sort((a, b) => a - b);
    aggregateChart.setData(rounds, [rounds.map((r) => state.train.get(r) ?? null), rounds.map((r) => state.validation.get(r) ?? null)]);
    aggregateChartBox.dataset.validation = JSON.stringify(Object.fromEntries([...state.validation].sort((a, b) => a[0] - b[0])));
    drawLossSummary();
    drawRounds();

    let index = 0;
    for (const w of state.workers.values()) drawWorker(w, index++);
  }

  function drawLossSummary() {
    const parts = [];
    const initial = state.validation.get(0);
    if (isNumber(initial)) parts.push(`starting weights ${fmtNumber(initial)}`);
    const finalLoss = state.committed > 0 ? state.validation.get(state.committed) : undefined;
    if (isNumber(finalLoss)) parts.push(`after round ${state.committed} (the result) ${fmtNumber(finalLoss)}`);
    const best = bestRound();
    if (best !== null) {
      const bestLoss = state.job?.best_validation_loss ?? state.validation.get(best);
      parts.push(`best after round ${best} ${fmtNumber(bestLoss)}`);
    }
    lossSummary.textContent = parts.length ? `Validation loss: ${parts.join('; ')}.` : '';
    lossSummary.dataset.bestRound = best ?? '';
  }

  // What the card says about a worker: its part in this job while it has one, else its real state.
  function workerStatus(w) {
    const info = state.workerInfo.get(w.id);
    const inJob = !TERMINAL.has(state.status) && w.state !== 'ended' && w.state !== 'idle';
    if (inJob) {
      const total = state.totalRounds;
      const finalEvaluation = w.kind === 'evaluate' || isFinalEvaluationRound(w.round);
      const of = finalEvaluation ? w.totalSteps : state.stepsPerRound || w.totalSteps;
      const steps = of ? `step ${w.step} of ${of}` : `step ${w.step}`;
      const where = finalEvaluation ? 'final evaluation' : `round ${w.round} of ${total}`;
      const text = w.state === 'training' || w.state === 'evaluating' ? `${finalEvaluation ? 'final evaluation' : 'training'} — ${steps}${finalEvaluation ? '' : ` in ${where}`}`
        : w.state === 'reported' ? `reported its update for ${where}`
          : `${w.state} in ${where}${w.reason ? `: ${w.reason}` : ''}`;
      return { badge: w.state === 'evaluating' ? 'evaluating' : w.state, text, of, showProgress: w.state === 'training' || w.state === 'evaluating' };
    }
    if (!info) return { badge: 'unknown', text: 'state not known yet', of: 0, showProgress: false };
    if (info.status === 'busy' && info.current_job_id && info.current_job_id !== jobId) {
      return { badge: 'busy', text: `busy with training job #${info.current_job_id}`, link: info.current_job_id, of: 0, showProgress: false };
    }
    if (info.status === 'online' || info.status === 'busy') {
      return { badge: 'idle', text: 'online, idle (no task of this job)', of: 0, showProgress: false };
    }
    return { badge: info.status, text: info.status === 'offline' ? 'offline' : info.status, of: 0, showProgress: false };
  }

  // The worker's trainer of the job's name, as its hello described it: "builtin (pytorch-tabular 0.1)".
  function trainerOf(workerId) {
    const name = state.job?.spec?.config?.trainer;
    const offered = state.workerInfo.get(workerId)?.trainers ?? [];
    const t = offered.find((x) => x.name === name);
    if (!name || !t) return '—';
    const described = [t.describe?.name, t.describe?.version].filter(Boolean).join(' ');
    return described ? `${name} (${described})` : name;
  }

  function utilizationLabel(device) {
    if (device === 'gpu') return 'GPU utilisation';
    if (device === 'host_cpu') return 'Host CPU (whole machine)';
    return 'Utilisation (device not reported)';
  }

  function drawWorker(w, index) {
    let card = cards.get(w.id);
    if (!card) {
      const fields = {
        state: h('span'), progress: h('div'), task: h('p', { class: 'worker-task' }), device: h('span'),
        loss: h('span'), throughput: h('span', { class: 'stat-throughput' }), utilization: h('span', { class: 'stat-utilization' }),
        utilizationLabel: h('dt', { class: 'stat-utilization-label' }, 'Utilisation'),
        memory: h('span', { class: 'stat-memory' }), trainer: h('span', { class: 'stat-trainer' }),
      };
      const chartBox = h('div', { class: 'worker-chart', dataset: { workerId: w.id } });
      const root = h('article', { class: 'card worker-card', dataset: { workerId: w.id } },
        h('h3', {}, h('span', { class: 'worker-name' }, workerName(w.id)), ' ', fields.state),
        fields.task, fields.progress,
        h('dl', { class: 'stats' },
          h('dt', {}, 'Device'), h('dd', {}, fields.device),
          h('dt', {}, 'Trainer'), h('dd', {}, fields.trainer),
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
    card.root.querySelector('.worker-name').textContent = workerName(w.id);
    const shown = workerStatus(w);
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
      : `${(w.memoryUsed / 2 ** 30).toFixed(1)} / ${(w.memoryTotal / 2 ** 30).toFixed(1)} GiB`;
    card.fields.trainer.textContent = trainerOf(w.id);
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
      state.status = job.status;
      state.stepsPerRound = job.spec?.distributed?.steps_per_round ?? 0;
      applyJob(job);
      title.textContent = job.name;
      title.append(h('span', { class: 'muted' }, ` #${job.id}`));
      document.title = `${job.name} · Parsyn`;
    } catch (err) {
      actionMessage.textContent = `Could not load training job ${jobId}: ${err.message}`;
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
    clearTimeout(roundsTimer);
    clearTimeout(workersTimer);
    aggregateChart.destroy();
    for (const card of cards.values()) card.chart.destroy();
  };
}
