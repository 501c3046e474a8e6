// Workers page: every registered worker with kind, online/offline, device, current job and last heartbeat,
// re-read every 3 s (the API has no workers events stream).
import { listAll } from './api.js';
import { h, replaceKeepingFocus, fmtAgo, statusBadge } from './dom.js';

const REFRESH_MS = 3000;

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
          h('th', { scope: 'col' }, 'Current job'), h('th', { scope: 'col' }, 'Last heartbeat'))),
        body)),
    status,
  );
  let timer = null;
  let stopped = false;
  async function refresh() {
    try {
      const { workers } = await listAll('/workers', 'workers');
      if (stopped) return;
      replaceKeepingFocus(body, workers.map((w) => h('tr', { dataset: { workerId: w.id, status: w.status } },
        h('td', {}, w.name, h('span', { class: 'muted' }, ` #${w.id}`)),
        h('td', {}, w.kind === 'managed' ? 'managed' : 'own'),
        h('td', {}, statusBadge(w.status)),
        h('td', {}, w.device || '—'),
        h('td', {}, w.current_job_id ? h('a', { href: `#/jobs/${w.current_job_id}` }, `#${w.current_job_id}`) : '—'),
        h('td', {}, fmtAgo(w.last_heartbeat_at_ms)))));
      status.textContent = workers.length ? '' : 'No workers registered yet.';
    } catch (err) {
      status.textContent = `Could not load workers: ${err.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
