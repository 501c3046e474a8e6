// Audit log page (#/audit): the coordinator's audit records, newest first, one page at a time ("Older records"
// reads the next), filtered by actor, action and outcome (GET /api/v1/audit; a project owner who is no platform admin
// reads the current project's, ?project=NAME). Checkpoints show which key signed them; the page
// names the key (GET /api/v1/audit/key) and how to verify an export offline.
import { api, ApiError } from './api.js';
import { h, fmtTime, replaceKeepingFocus, statusBadge } from './dom.js';
import { currentProject } from './projects.js';

const PAGE = 50;

/**
 * A record as GET /audit lists it; only the fields this page reads.
 * @typedef {{seq: number, time: string, actor: string, action: string, object: string, outcome: string,
 *   status: number, detail: string, source: string, request_id: string,
 *   checkpoint?: {seq: number, key_id: string}}} AuditRecord
 */

/**
 * The query of the filters' current values.
 * @param {Record<string, string>} filters @param {string | null} cursor
 */
export function auditQuery(filters, cursor) {
  const params = new URLSearchParams({ order: 'desc', limit: String(PAGE) });
  for (const [name, value] of Object.entries(filters)) {
    if (value.trim()) params.set(name, value.trim());
  }
  if (cursor !== null) params.set('cursor', cursor);
  return `/audit?${params}`;
}

/** @param {AuditRecord} r */
function row(r) {
  const what = r.checkpoint ? `signs record ${r.checkpoint.seq} (key ${r.checkpoint.key_id})` : r.object;
  return h('tr', { dataset: { seq: r.seq, outcome: r.outcome } },
    h('td', {}, String(r.seq)),
    h('td', { title: r.time }, fmtTime(Date.parse(r.time))),
    h('td', {}, r.actor),
    h('td', {}, h('code', {}, r.action)),
    h('td', { class: 'audit-object' }, what),
    h('td', { title: r.detail }, statusBadge(r.outcome),
      r.status ? ` ${r.status}` : ''),
    h('td', {}, r.source || '—'),
    h('td', {}, h('code', {}, r.request_id || '—')));
}

/** @param {HTMLElement} container */
export function render(container) {
  const heading = h('h1', {}, 'Audit log');
  const actor = h('input', { id: 'audit-actor', placeholder: 'admin, worker 7, anonymous' });
  const action = h('input', { id: 'audit-action', placeholder: 'POST /api/v1/training-jobs' });
  const outcome = h('select', { id: 'audit-outcome' },
    h('option', { value: '' }, 'any'), h('option', { value: 'success' }, 'success'),
    h('option', { value: 'failure' }, 'failure'), h('option', { value: 'denied' }, 'denied'));
  const form = h('form', { class: 'audit-filters', role: 'search' },
    h('label', { for: 'audit-actor' }, 'Actor'), actor,
    h('label', { for: 'audit-action' }, 'Action'), action,
    h('label', { for: 'audit-outcome' }, 'Outcome'), outcome,
    h('button', { type: 'submit' }, 'Filter'));
  const body = h('tbody');
  const status = h('p', { class: 'muted', role: 'status' }, 'Loading…');
  const more = h('button', { type: 'button', id: 'audit-more', hidden: true }, 'Older records');
  const key = h('p', { class: 'muted', id: 'audit-key' });
  container.append(
    h('div', { class: 'page-head' }, heading),
    key,
    form,
    h('div', { class: 'table-wrap' },
      h('table', { id: 'audit-table' },
        h('thead', {}, h('tr', {}, ...['#', 'Time', 'Actor', 'Action', 'Object', 'Outcome', 'Source', 'Request']
          .map((name) => h('th', { scope: 'col' }, name)))),
        body)),
    status,
    more,
  );
  let stopped = false;
  /** @type {AuditRecord[]} */
  let records = [];
  /** @type {string | null} */
  let cursor = null;
  let generation = 0;  // a new filter supersedes a page still loading

  // The whole log (a platform admin's), else the current project's records (its owners'): the first 403 says which.
  /** @type {Record<string, string>} */
  let scope = {};
  /** @param {{actor: string, action: string, outcome: string}} filters */
  async function readPage(filters) {
    try {
      return await api('GET', auditQuery({ ...filters, ...scope }, cursor));
    } catch (err) {
      const project = currentProject();
      if (!(err instanceof ApiError) || err.status !== 403 || scope.project || !project) throw err;
      scope = { project: project.name };
      heading.textContent = `Audit log of ${project.name}`;
      return api('GET', auditQuery({ ...filters, ...scope }, cursor));
    }
  }

  /** @param {boolean} fresh */
  async function load(fresh) {
    const mine = fresh ? ++generation : generation;
    if (fresh) {
      records = [];
      cursor = null;
    }
    status.textContent = 'Loading…';
    more.hidden = true;
    const filters = { actor: actor.value, action: action.value, outcome: outcome.value };
    try {
      const page = await readPage(filters);
      if (stopped || mine !== generation) return;
      records.push(...page.records);
      cursor = page.next_cursor ?? null;
      replaceKeepingFocus(body, records.map(row));
      status.textContent = records.length ? '' : 'No records match.';
      more.hidden = cursor === null;
    } catch (err) {
      if (!stopped) status.textContent = `Could not load the audit log: ${/** @type {Error} */ (err).message}`;
    }
  }

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    load(true);
  });
  more.addEventListener('click', () => load(false));
  api('GET', '/audit/key').then((k) => {
    if (!stopped) {
      key.textContent = `Checkpoints are signed with Ed25519 key ${k.key_id}. Verify a copy offline: ` +
        '`parsyn audit export --out audit.jsonl`, `parsyn audit key --out audit.pub`, then ' +
        '`parsyn audit verify audit.jsonl --key audit.pub`.';
    }
  }).catch(() => {});
  load(true);
  return () => {
    stopped = true;
  };
}
