// Training page: every job with its status, round x of y, workers and times. The API has no events stream across
// jobs, so the list is re-read every 2 s; an active job's workers come from its live view.
import { api, listAll } from './api.js';
import { h, replaceKeepingFocus, fmtTime, statusBadge, progressBar, TERMINAL } from './dom.js';

const REFRESH_MS = 2000;

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

  // Job id -> its detail (spec, live view); terminal jobs are read once, active ones on every refresh.
  const details = new Map();
  let timer = null;
  let stopped = false;

  async function refresh() {
    try {
      const { training_jobs: jobs } = await listAll('/training-jobs', 'training_jobs');
      await Promise.all(jobs.map(async (job) => {
        const known = details.get(job.id);
        if (known && TERMINAL.has(known.status)) return;
        try {
          details.set(job.id, await api('GET', `/training-jobs/${job.id}`));
        } catch {
          // Shown without its workers until the next refresh.
        }
      }));
      if (stopped) return;
      jobs.sort((a, b) => b.id - a.id);
      replaceKeepingFocus(body, jobs.map((job) => row(job, details.get(job.id))));
      status.textContent = jobs.length ? '' : 'No training jobs yet. Start one with “New job”.';
    } catch (err) {
      status.textContent = `Could not load jobs: ${err.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function row(job, detail) {
  const total = job.total_rounds ?? 0;
  // The round being worked on while active; the last committed one when over. The final evaluation (which the
  // coordinator runs after the last round) is the job's end, not a round above total_rounds.
  const over = TERMINAL.has(job.status);
  const finalEvaluation = !over && (detail?.live?.phase === 'final_evaluation' || job.current_round > total);
  const shown = over ? job.committed_round : Math.min(Math.max(job.current_round, job.committed_round), total);
  const spec = detail?.spec;
  let workers = '—';
  // Only a running job has workers in it; an ended job's workers are listed on the Workers page.
  if (!over && detail?.live?.workers) {
    const active = detail.live.workers.filter((w) => w.state !== 'dropped').length;
    workers = finalEvaluation ? `${active} evaluating` : `${active} in round`;
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
