// Small DOM helpers shared by the pages. Text always goes in as text nodes, never as HTML.

/**
 * What h() and append() take as children: nodes, text (numbers as text), nothing, or lists of them.
 * @typedef {Node | string | number | null | undefined | false | ChildList} Child
 * @typedef {Child[]} ChildList
 */

// h('div', {class: 'x', onclick: f}, child, 'text', [more]) -> Element
/**
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any> | null} [attrs]  attributes; on* functions become listeners, `dataset` entries data-*
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') el.addEventListener(name.slice(2), value);
    else if (name === 'class') el.className = value;
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(name, '');
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

/** @param {Element} el @param {Child[]} children */
function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** @param {number | null | undefined} ms */
export function fmtTime(ms) {
  if (ms === null || ms === undefined) return '—';
  const d = new Date(ms);
  const pad = (/** @type {number} */ n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** @param {number | null | undefined} ms */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

/** @param {number | null | undefined} n */
export function fmtBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

/** @param {number | null | undefined} ms */
export function fmtAgo(ms) {
  if (ms === null || ms === undefined) return 'never';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  return fmtTime(ms);
}

// A status pill: <span class="status status-running">running</span>
/** @param {string} status */
export function statusBadge(status) {
  return h('span', { class: `status status-${status}` }, status);
}

// A labelled progress bar (role=progressbar) showing value of max.
/** @param {number} value @param {number} max @param {string} label */
export function progressBar(value, max, label) {
  const pct = max > 0 ? Math.min(100, Math.round((100 * value) / max)) : 0;
  return h(
    'div',
    { class: 'bar', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': max, 'aria-valuenow': value,
      'aria-label': label },
    h('div', { class: 'bar-fill', style: `width:${pct}%` }),
  );
}

export const TERMINAL = new Set(['succeeded', 'failed', 'stopped', 'cancelled']);

// Replaces parent's children; a link or button inside that had the keyboard focus gets it back in the new content
// (matched by href or id), so periodic refreshes do not throw a keyboard user back to the top.
/** @param {Element} parent @param {(Node | string)[]} children */
export function replaceKeepingFocus(parent, children) {
  const focused = parent.contains(document.activeElement) ? document.activeElement : null;
  const href = focused?.getAttribute('href');
  const id = focused?.id;
  parent.replaceChildren(...children);
  if (!focused) return;
  const again = (href && parent.querySelector(`[href="${CSS.escape(href)}"]`)) || (id && document.getElementById(id));
  if (again) /** @type {HTMLElement} */ (again).focus();
}

/**
 * One run of `task` for a burst of requests: the first request starts a `delayMs` timer and the requests that come
 * before it fires join that run. Unlike a debounce (each request restarting the timer), a steady stream of requests,
 * such as rounds that end faster than `delayMs`, still runs `task` every `delayMs` instead of never.
 * @param {() => void} task
 * @param {number} delayMs
 * @returns {{ request: () => void, cancel: () => void }}
 */
export function coalescedRunner(task, delayMs) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer = undefined;
  return {
    request() {
      if (timer !== undefined) return;
      timer = setTimeout(() => { timer = undefined; task(); }, delayMs);
    },
    cancel() {
      clearTimeout(timer);
      timer = undefined;
    },
  };
}
