// Workers page: every registered worker with kind, online/offline, device, the trainers it offers (its hello's, with
// the model kinds each trains as their title), current job and last heartbeat. The list
// is read once (and again when the events stream says to: a "reset"), then patched from GET /api/v1/events'
// "workers" events (the changed fields of each worker, sent in batches about once a second; heartbeat times come
// with the server's presence flush); while the stream is down it is re-read every 3 s.
import { listAll, followListLive } from './api.js';
import { h, replaceKeepingFocus, fmtAgo, statusBadge, coalescedRunner } from './dom.js';

const FALLBACK_REFRESH_MS = 3000;
const AGO_REDRAW_MS = 5000;  // "12 s ago" ages in place, without a request

// One chip per offered trainer: its name, with what it trains as the title.
/**
 * A worker as GET /workers lists it; only the fields this page reads.
 * @typedef {{id: number, name: string, kind: string, status: string, device?: string, trainers?: Trainer[],
 *   current_job_id: number | null, last_heartbeat_at_ms: number | null}} WorkerSummary
 * @typedef {{name: string, describe?: {model_kinds?: string[]}}} Trainer
 */

/** @param {Trainer[] | undefined} trainers @returns {(HTMLElement | string)[]} */
function trainerChips(trainers) {
  if (!Array.isArray(trainers) || trainers.length === 0) return ['—'];
  return trainers.map((t) => h('span', { class: 'chip', title: (t.describe?.model_kinds ?? []).join(', ') }, t.name));
}

/** @param {HTMLElement} container */
export function render(container) {
  const body = h('tbody');
  const status = h('p', { class: 'muted', role: 'status' }, 'Loading…');
  container.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Workers')),
    h('p', { class: 'muted' }, 'Register a worker with `parsyn worker register`, then start it with ' +
      '`parsyn worker --server URL --token TOKEN`.'),
    h('div', { class: 'table-wrap' },
      h('table', { id: 'workers-table' },
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, 'Worker'), h('th', { scope: 'col' }, 'Kind'),
          h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col' }, 'Device'),
          h('th', { scope: 'col' }, 'Trainers'),
          h('th', { scope: 'col' }, 'Current job'), h('th', { scope: 'col' }, 'Last heartbeat'))),
        body)),
    status,
  );
  /** @type {Map<number, WorkerSummary>} */
  const workers = new Map();  // id -> the worker as GET /workers shows it
  let stopped = false;
  function draw() {
    if (stopped) return;
    const list = [...workers.values()].sort((a, b) => a.id - b.id);
    replaceKeepingFocus(body, list.map((w) => h('tr', { dataset: { workerId: w.id, status: w.status } },
      h('td', {}, w.name, h('span', { class: 'muted' }, ` #${w.id}`)),
      h('td', {}, w.kind === 'managed' ? 'managed' : 'own'),
      h('td', {}, statusBadge(w.status)),
      h('td', {}, w.device || '—'),
      h('td', { class: 'worker-trainers' }, ...trainerChips(w.trainers)),
      h('td', {}, w.current_job_id ? h('a', { href: `#/jobs/${w.current_job_id}` }, `#${w.current_job_id}`) : '—'),
      h('td', {}, fmtAgo(w.last_heartbeat_at_ms)))));
    status.textContent = list.length ? '' : 'No workers registered yet.';
  }
  // Many events may come at once (workers coming online together): one redraw for them.
  const redraw = coalescedRunner(draw, 50);
  const agoTimer = setInterval(redraw.request, AGO_REDRAW_MS);

  async function load() {
    try {
      const { workers: list } = await listAll('/workers', 'workers');
      workers.clear();
      for (const w of list) workers.set(w.id, w);
      draw();
    } catch (err) {
      status.textContent = `Could not load workers: ${/** @type {Error} */ (err).message}`;
    }
  }

  /** @param {string} type @param {any} data an event of GET /events @param {() => Promise<void>} reload */
  function apply(type, data, reload) {
    if (type !== 'workers') return;
    for (const change of data.workers) {
      const known = workers.get(change.id);
      if (known) {
        Object.assign(known, change);
      } else if ('name' in change) {
        workers.set(change.id, { current_job_id: null, ...change });  // registered: its whole view
      } else {
        reload();  // a worker this page has not seen (registered while the stream was down)
        return;
      }
    }
    redraw.request();
  }

  const unfollow = followListLive({
    load,
    apply,
    fallbackMs: FALLBACK_REFRESH_MS,
    onUnavailable(error) {
      status.textContent = `Live updates unavailable (${error.message}); re-reading every 3 s.`;
    },
  });
  return () => {
    stopped = true;
    unfollow();
    clearInterval(agoTimer);
    redraw.cancel();
  };
}
