// Training page: every job with its status, round x of y, workers and times. The list is read once (and again when
// the events stream says to: a "reset"), then patched from GET /api/v1/events (job_created, job_status,
// round_started, round_committed, and job_live for the phase and the workers in the round); while the stream is
// down it is re-read every 2 s.
import { api, listAll, followListLive } from './api.js';
import { h, replaceKeepingFocus, fmtTime, statusBadge, progressBar, TERMINAL, coalescedRunner } from './dom.js';

const FALLBACK_REFRESH_MS = 2000;

/**
 * A job as the list (and job_created) gives it; only the fields this page reads.
 * @typedef {{id: number, name: string, status: string, total_rounds?: number | null, current_round: number,
 *   committed_round: number, created_at_ms: number, started_at_ms?: number | null, finished_at_ms?: number | null}} JobSummary
 * What the page knows besides: the job's spec (its worker range) and, while it runs, its live phase and the count of
 * workers in the round.
 * @typedef {{spec?: {distributed?: {min_workers: number, max_workers: number}} | null, phase?: string,
 *   active?: number}} JobDetail
 */

/** @param {HTMLElement} container */
export function render(container) {
  const body = h('tbody');
  const status = h('p', { class: 'muted', role: 'status' }, 'Loading…');
  container.append(
    h('div', { class: 'page-head' },
      h('h1', {}, 'Training'),
      h('a', { class: 'button primary', href: '#/jobs/new' }, 'New job')),
    h('div', { class: 'table-wrap' },
      h('table', { id: 'jobs-table' },
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, 'Job'), h('th', { scope: 'col' }, 'Status'),
          h('th', { scope: 'col' }, 'Round'), h('th', { scope: 'col' }, 'Workers'),
          h('th', { scope: 'col' }, 'Created'), h('th', { scope: 'col' }, 'Finished'))),
        body)),
    status,
  );

  // Job id -> its summary (the list's), and -> {spec, phase, active} (the spec's worker range; the live phase and
  // the count of workers in the round while it runs). Terminal jobs' details are read once.
  /** @type {Map<number, JobSummary>} */
  const jobs = new Map();
  /** @type {Map<number, JobDetail>} */
  const details = new Map();
  let stopped = false;
  function draw() {
    if (stopped) return;
    const list = [...jobs.values()].sort((a, b) => b.id - a.id);
    replaceKeepingFocus(body, list.map((job) => row(job, details.get(job.id))));
    status.textContent = list.length ? '' : 'No training jobs yet. Start one with “New job”.';
  }
  // Many events may come at once (a burst of rounds): one redraw for them.
  const redraw = coalescedRunner(draw, 50);

  /** @param {number} id */
  async function readDetail(id) {
    try {
      const view = await api('GET', `/training-jobs/${id}`);
      const live = view.live?.workers;
      details.set(id, { spec: view.spec, phase: view.live?.phase,
        active: live ? live.filter((/** @type {{state: string}} */ w) => w.state !== 'dropped').length : undefined });
    } catch {
      // Shown without its workers.
    }
  }

  async function load() {
    try {
      const { training_jobs: list } = await listAll('/training-jobs', 'training_jobs');
      await Promise.all(list.map(async (job) => {
        const known = jobs.get(job.id);
        if (known && TERMINAL.has(known.status) && details.has(job.id)) return;
        await readDetail(job.id);
      }));
      jobs.clear();
      for (const job of list) jobs.set(job.id, job);
      draw();
    } catch (err) {
      status.textContent = `Could not load jobs: ${/** @type {Error} */ (err).message}`;
    }
  }

  /** @param {string} type @param {any} data an event of GET /events @param {() => Promise<void>} reload */
  function apply(type, data, reload) {
    if (!('job_id' in data)) return;
    const id = data.job_id;
    if (type === 'job_created') {
      const { spec, job_id: _, time_ms: __, ...summary } = data;
      jobs.set(id, summary);
      details.set(id, { spec });
      redraw.request();
      return;
    }
    const job = jobs.get(id);
    if (!job) {
      reload();  // a job this page has not seen (created while the stream was down)
      return;
    }
    const detail = details.get(id) ?? {};
    details.set(id, detail);
    if (type === 'job_status') {
      job.status = data.status;
      if (data.committed_round !== undefined) job.committed_round = data.committed_round;
      if (data.status === 'running' && !job.started_at_ms) job.started_at_ms = data.time_ms;
      if (TERMINAL.has(data.status)) {
        job.finished_at_ms = data.time_ms;
        detail.phase = undefined;
        detail.active = undefined;
      }
    } else if (type === 'round_started') {
      job.current_round = data.round;
    } else if (type === 'job_live') {
      if (TERMINAL.has(job.status)) return;
      detail.phase = data.phase;
      detail.active = data.active_workers;
      if (data.round !== undefined) job.current_round = data.round;
    } else if (type === 'round_committed') {
      job.committed_round = data.round;
    } else {
      return;
    }
    redraw.request();
  }

  const unfollow = followListLive({
    load,
    apply,
    fallbackMs: FALLBACK_REFRESH_MS,
    onUnavailable(error) {
      status.textContent = `Live updates unavailable (${error.message}); re-reading every 2 s.`;
    },
  });
  return () => {
    stopped = true;
    unfollow();
    redraw.cancel();
  };
}

/** @param {JobSummary} job @param {JobDetail | undefined} detail */
function row(job, detail) {
  const total = job.total_rounds ?? 0;
  // The round being worked on while active; the last committed one when over. The final evaluation (which the
  // coordinator runs after the last round) is the job's end, not a round above total_rounds.
  const over = TERMINAL.has(job.status);
  const finalEvaluation = !over && (detail?.phase === 'final_evaluation' || job.current_round > total);
  const shown = over ? job.committed_round : Math.min(Math.max(job.current_round, job.committed_round), total);
  const spec = detail?.spec;
  let workers = '—';
  // Only a running job has workers in it; an ended job's workers are listed on the Workers page.
  if (!over && detail?.active !== undefined) {
    workers = finalEvaluation ? `${detail.active} evaluating` : `${detail.active} in round`;
  }
  if (spec?.distributed) {
    const d = spec.distributed;
    const range = d.min_workers === d.max_workers ? `${d.min_workers}` : `${d.min_workers}–${d.max_workers}`;
    workers = workers === '—' ? `${range} wanted` : `${workers} (${range} wanted)`;
  }
  return h('tr', { dataset: { jobId: job.id, status: job.status } },
    h('td', {}, h('a', { href: `#/jobs/${job.id}` }, job.name), h('span', { class: 'muted' }, ` #${job.id}`)),
    h('td', {}, statusBadge(job.status)),
    h('td', { class: 'round-cell' },
      h('span', { class: 'round-text' }, finalEvaluation ? `final evaluation (${shown} of ${total} done)` : `${shown} of ${total}`),
      progressBar(job.committed_round, total, `Job ${job.name}: ${job.committed_round} of ${total} rounds done`)),
    h('td', {}, workers),
    h('td', {}, fmtTime(job.created_at_ms)),
    h('td', {}, fmtTime(job.finished_at_ms)));
}
