// API keys page (#/keys): the signed-in user's own keys (GET /api/v1/keys: names, expiry, revoked; never a key
// itself), a form that makes a new one and shows it once, and a Revoke button for each key still in use.
import { api, listAll } from './api.js';
import { h, fmtTime, replaceKeepingFocus, statusBadge } from './dom.js';

/**
 * A key as GET /keys lists it.
 * @typedef {{id: number, name: string, user: string | null, created_at_ms: number,
 *   expires_at_ms: number | null, revoked_at_ms: number | null}} ApiKey
 */

/** "revoked", "expired" or "active" at `now`. @param {ApiKey} k @param {number} now */
export function keyState(k, now) {
  if (k.revoked_at_ms !== null) return 'revoked';
  if (k.expires_at_ms !== null && k.expires_at_ms <= now) return 'expired';
  return 'active';
}

/** @param {HTMLElement} container */
export function render(container) {
  const name = h('input', { id: 'key-name', required: true, maxlength: 64, placeholder: 'laptop, ci' });
  const days = h('input', { id: 'key-days', type: 'number', min: 1, max: 3650, placeholder: 'never' });
  const error = h('p', { class: 'field-error', role: 'alert', id: 'key-error' });
  const shown = h('div', { class: 'notice', id: 'new-key', hidden: true });
  const form = h('form', { id: 'key-form', class: 'audit-filters', novalidate: true },
    h('label', { for: 'key-name' }, 'Name'), name,
    h('label', { for: 'key-days' }, 'Expires in days'), days,
    h('button', { type: 'submit', class: 'primary' }, 'Make a key'));
  const body = h('tbody');
  const status = h('p', { class: 'muted', role: 'status' }, 'Loading…');
  container.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'API keys')),
    h('p', { class: 'muted' }, 'Your keys for the CLI (`--api-key`, PARSYN_API_KEY) and the API. A key is shown ' +
      'once, when it is made; the server keeps only its hash.'),
    form, error, shown,
    h('div', { class: 'table-wrap' },
      h('table', { id: 'keys-table' },
        h('thead', {}, h('tr', {}, ...['#', 'Name', 'Made', 'Expires', 'State', '']
          .map((title) => h('th', { scope: 'col' }, title)))),
        body)),
    status,
  );
  let stopped = false;

  async function load() {
    try {
      const { keys } = await listAll('/keys', 'keys');
      if (stopped) return;
      const now = Date.now();
      replaceKeepingFocus(body, keys.map((/** @type {ApiKey} */ k) => {
        const state = keyState(k, now);
        const revoke = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke key ${k.name}` }, 'Revoke');
        revoke.addEventListener('click', async () => {
          if (!confirm(`Revoke the key "${k.name}"? Whatever uses it is refused from now on.`)) return;
          revoke.disabled = true;
          try {
            await api('DELETE', `/keys/${k.id}`);
          } catch (err) {
            error.textContent = `Could not revoke it: ${/** @type {Error} */ (err).message}`;
          }
          load();
        });
        return h('tr', { dataset: { keyId: k.id, state } },
          h('td', {}, String(k.id)), h('td', {}, k.name), h('td', {}, fmtTime(k.created_at_ms)),
          h('td', {}, k.expires_at_ms === null ? 'never' : fmtTime(k.expires_at_ms)),
          h('td', {}, statusBadge(state)), h('td', {}, state === 'active' ? revoke : ''));
      }));
      status.textContent = keys.length ? '' : 'No keys yet.';
    } catch (err) {
      if (!stopped) status.textContent = `Could not load your keys: ${/** @type {Error} */ (err).message}`;
    }
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    /** @type {{name: string, expires_in_days?: number}} */
    const request = { name: name.value.trim() };
    if (days.value) request.expires_in_days = Number(days.value);
    try {
      const made = await api('POST', '/keys', request);
      shown.replaceChildren(h('h2', {}, `Key "${made.name}" made`),
        h('p', {}, 'Copy it now: it is not shown again.'), h('code', { id: 'new-key-value' }, made.key));
      shown.hidden = false;
      name.value = '';
      days.value = '';
      load();
    } catch (err) {
      error.textContent = /** @type {Error} */ (err).message;
    }
  });
  load();
  return () => {
    stopped = true;
  };
}
