// Job detail view, live from the job's events stream: the stream replays every stored event from the first, so the
// page is built by the same code path whether the job ended long ago or is running now. The round history table is
// re-read from /rounds when a round ends; everything else follows the events.
import { api, download, followJobEvents } from './api.js';
import { h, fmtTime, fmtDuration, fmtBytes, statusBadge, progressBar, TERMINAL } from './dom.js';
import { LineChart, fmtNumber } from './charts.js';

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
    validation: new Map(),  // global round -> validation loss
    committed: 0,        // last committed round
  };

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
  const lists = {
    training: h('ul', { class: 'chips', id: 'training-list', 'aria-label': 'Still training' }),
    reported: h('ul', { class: 'chips', id: 'reported-list', 'aria-label': 'Reported' }),
    dropped: h('ul', { class: 'chips', id: 'dropped-list', 'aria-label': 'Dropped' }),
  };
  const workerCards = h('div', { class: 'worker-cards', id: 'worker-cards' });
  const aggregateChartBox = h('div', { id: 'aggregate-chart' });
  const roundsBody = h('tbody');
  const artifactsBox = h('div', { id: 'artifacts' }, h('p', { class: 'muted' }, 'The result can be downloaded once a round has been committed and the job has ended.'));

  container.append(
    h('div', { class: 'page-head' }, h('div', {}, h('a', { href: '#/training', class: 'muted' }, '← Training'), title),
      h('div', { class: 'head-actions' }, statusSlot, liveSlot, stopButton, cancelButton)),
    actionMessage,
    h('section', { class: 'card', 'aria-labelledby': 'progress-h' },
      h('h2', { id: 'progress-h' }, 'Progress'),
      h('p', { class: 'round-line' }, 'Round ', roundText), roundBar, reasonText,
      h('div', { class: 'state-lists' },
        h('div', {}, h('h3', {}, 'Training'), lists.training),
        h('div', {}, h('h3', {}, 'Reported'), lists.reported),
        h('div', {}, h('h3', {}, 'Dropped'), lists.dropped))),
    h('section', { class: 'card', 'aria-labelledby': 'aggregate-h' },
      h('h2', { id: 'aggregate-h' }, 'Loss per round'),
      h('p', { class: 'muted' }, 'Aggregated training loss of each committed round; validation loss of the global model after each round (round 0: the starting model).'),
      aggregateChartBox),
    h('section', { 'aria-labelledby': 'workers-h' }, h('h2', { id: 'workers-h' }, 'Workers'), workerCards),
    h('section', { class: 'card', 'aria-labelledby': 'rounds-h' },
      h('h2', { id: 'rounds-h' }, 'Round history'),
      h('div', { class: 'table-wrap' }, h('table', { id: 'rounds-table' },
        h('thead', {}, h('tr', {}, ...['Round', 'Outcome', 'Participants', 'Duration', 'Bytes', 'Train loss', 'Validation loss']
          .map((t) => h('th', { scope: 'col' }, t)))),
        roundsBody))),
    h('section', { class: 'card', 'aria-labelledby': 'result-h' }, h('h2', { id: 'result-h' }, 'Result'), artifactsBox),
  );

  const aggregateChart = new LineChart(aggregateChartBox, {
    xLabel: 'round', yLabel: 'loss', height: 220,
    series: [{ label: 'training loss (aggregated)', colorIndex: 0 }, { label: 'validation loss', colorIndex: 1 }],
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
  async function loadNames() {
    try {
      const { workers } = await api('GET', '/workers');
      for (const w of workers) state.names.set(w.id, w.name);
      schedule();
    } catch {
      // Workers show by id.
    }
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
      roundsBody.replaceChildren(...rounds.map((r) => h('tr', { dataset: { round: r.round, outcome: r.outcome } },
        h('td', {}, r.attempt > 1 ? `${r.round} (attempt ${r.attempt})` : `${r.round}`),
        h('td', {}, statusBadge(r.outcome), r.failure_reason ? h('span', { class: 'muted' }, ` ${r.failure_reason}`) : null),
        h('td', {}, r.participants.map((id) => workerName(id)).join(', ') || '—'),
        h('td', {}, fmtDuration(r.duration_ms)),
        h('td', {}, fmtBytes(r.bytes_moved)),
        h('td', {}, fmtNumber(r.train_loss)),
        h('td', {}, fmtNumber(r.validation_loss)))));
      if (!rounds.length) roundsBody.replaceChildren(h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No rounds yet.')));
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

  function workerName(id) {
    return state.names.get(id) ?? `worker #${id}`;
  }
  function workerState(id) {
    if (!state.workers.has(id)) {
      state.workers.set(id, { id, state: 'idle', reason: '', round: 0, step: 0, totalSteps: null, loss: null,
                              throughput: null, utilization: null, xs: [], losses: [] });
      if (!state.names.has(id)) loadNames();
    }
    return state.workers.get(id);
  }

  // ---- events ----
  function onEvent(type, e) {
    switch (type) {
      case 'job_status':
        state.status = e.status;
        state.reason = e.reason ?? '';
        if (TERMINAL.has(e.status)) {
          refreshRoundsSoon();
          loadArtifacts();
        }
        break;
      case 'round_started':
        state.round = e.round;
        state.attempt = e.attempt;
        state.totalRounds = e.total_rounds ?? state.totalRounds;
        for (const w of state.workers.values()) {
          w.state = 'idle';
          w.reason = '';
          w.step = 0;
        }
        for (const id of e.participants ?? []) Object.assign(workerState(id), { state: 'training', round: e.round });
        refreshRoundsSoon();
        break;
      case 'task_assigned':
        Object.assign(workerState(e.worker_id), {
          state: e.kind === 'evaluate' ? 'evaluating' : 'training', round: e.round, step: 0, reason: '' });
        break;
      case 'worker_progress': {
        const w = workerState(e.worker_id);
        w.round = e.round;
        w.step = e.step;
        w.totalSteps = e.total_steps ?? w.totalSteps;
        if (e.throughput !== undefined && e.throughput !== null) w.throughput = e.throughput;
        if (e.utilization !== undefined && e.utilization !== null) w.utilization = e.utilization;
        if (e.loss !== null && e.loss !== undefined) {
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
        Object.assign(workerState(e.worker_id), { state: 'rejected', reason: e.reason });
        break;
      case 'worker_dropped':
        Object.assign(workerState(e.worker_id), { state: 'dropped', reason: e.reason || e.cause });
        break;
      case 'round_committed':
        state.totalRounds = e.total_rounds ?? state.totalRounds;
        state.committed = e.round;
        if (e.train_loss !== null && e.train_loss !== undefined) state.train.set(e.round, e.train_loss);
        refreshRoundsSoon();
        break;
      case 'global_evaluated':
        if (e.validation_loss !== null && e.validation_loss !== undefined) state.validation.set(e.global_round, e.validation_loss);
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
    roundText.textContent = `${state.round} of ${total}${state.attempt > 1 ? ` (attempt ${state.attempt})` : ''}`;
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

    let index = 0;
    for (const w of state.workers.values()) drawWorker(w, index++);
  }

  function drawWorker(w, index) {
    let card = cards.get(w.id);
    if (!card) {
      const fields = {
        state: h('span'), progress: h('div'), step: h('span'), loss: h('span'), throughput: h('span'), utilization: h('span'),
      };
      const chartBox = h('div', { class: 'worker-chart', dataset: { workerId: w.id } });
      const root = h('article', { class: 'card worker-card', dataset: { workerId: w.id } },
        h('h3', {}, h('span', { class: 'worker-name' }, workerName(w.id)), ' ', fields.state),
        h('p', {}, 'Step ', fields.step), fields.progress,
        h('dl', { class: 'stats' },
          h('dt', {}, 'Loss'), h('dd', {}, fields.loss),
          h('dt', {}, 'Throughput'), h('dd', {}, fields.throughput),
          h('dt', {}, 'Utilisation'), h('dd', {}, fields.utilization)),
        chartBox);
      workerCards.append(root);
      const chart = new LineChart(chartBox, { xLabel: 'step', yLabel: 'loss', height: 160,
                                              series: [{ label: 'loss', colorIndex: index }] });
      card = { root, chart, fields, drawnPoints: -1 };
      cards.set(w.id, card);
    }
    card.root.querySelector('.worker-name').textContent = workerName(w.id);
    card.fields.state.replaceChildren(statusBadge(w.state));
    const of = state.stepsPerRound || w.totalSteps;
    card.fields.step.textContent = of ? `${w.step} of ${of} in round ${w.round}` : `${w.step} in round ${w.round}`;
    card.fields.progress.replaceChildren(progressBar(w.step, of || 0, `${workerName(w.id)}: step ${w.step} of ${of}`));
    card.fields.loss.textContent = fmtNumber(w.loss);
    card.fields.throughput.textContent = w.throughput === null ? '—' : `${fmtNumber(w.throughput, 3)} /s`;
    card.fields.utilization.textContent = w.utilization === null ? '—' : `${Math.round(w.utilization * 100)} %`;
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
      state.job = job;
      state.status = job.status;
      state.totalRounds = job.total_rounds ?? 0;
      state.stepsPerRound = job.spec?.distributed?.steps_per_round ?? 0;
      state.committed = job.committed_round;
      title.textContent = job.name;
      title.append(h('span', { class: 'muted' }, ` #${job.id}`));
      document.title = `${job.name} · Parsyn`;
    } catch (err) {
      actionMessage.textContent = `Could not load training job ${jobId}: ${err.message}`;
      liveSlot.textContent = '';
      return;
    }
    await loadNames();
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
    aggregateChart.destroy();
    for (const card of cards.values()) card.chart.destroy();
  };
}
