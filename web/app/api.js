// The dashboard's only way to the server: the public /api/v1 routes with the API key from session storage (or the
// single sign-on session's cookie), and the
// event streams (each job's, and the one across jobs) read through fetch (EventSource cannot send an Authorization
// header).

const KEY_NAME = 'parsyn.apiKey';
const PROJECT_NAME = 'parsyn.project';
// The "key" of a browser signed in with single sign-on: its session's key is in an HttpOnly cookie the page cannot
// read, sent by the browser itself; requests that change something repeat the CSRF cookie in X-CSRF-Token.
export const SSO_SESSION = 'sso-session';

// The value of the readable cookie `name` ('' when absent).
/** @param {string} name */
export function cookie(name) {
  const entry = document.cookie.split(';').map((c) => c.trim()).find((c) => c.startsWith(`${name}=`));
  return entry ? entry.slice(name.length + 1) : '';
}

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME);
}

/** @param {string | null} key */
export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

// The project every request acts in (X-Parsyn-Project; docs/operations.md, "Users, projects and roles"), kept for
// this tab; null before one is chosen (the server's "default").
export function project() {
  return sessionStorage.getItem(PROJECT_NAME);
}

/** @param {string | null} name */
export function setProject(name) {
  if (name) sessionStorage.setItem(PROJECT_NAME, name);
  else sessionStorage.removeItem(PROJECT_NAME);
}

// An error answer of the API: {"error": {"code", "message", "errors"?}} with its HTTP status. `errors` holds the
// request's problems one by one as {field, message} where the server lists them (job creation), else [].
export class ApiError extends Error {
  /**
   * @param {number} status @param {string} code @param {string} message
   * @param {{field: string | null, message: string}[]} [errors]
   */
  constructor(status, code, message, errors = []) {
    super(message);
    this.status = status;
    this.code = code;
    this.errors = errors;
  }
}

// Called with the ApiError when the server refuses the key (401), so the app can ask for it again.
/** @type {(error: ApiError) => void} */
let onUnauthenticated = () => {};
/** @param {(error: ApiError) => void} handler */
export function setUnauthenticatedHandler(handler) {
  onUnauthenticated = handler;
}

/** @param {Record<string, string>} [extra] @returns {Record<string, string>} */
function authHeaders(extra = {}) {
  /** @type {Record<string, string>} */
  const headers = apiKey() === SSO_SESSION
    ? { 'X-CSRF-Token': cookie('parsyn_csrf') }
    : { Authorization: `Bearer ${apiKey() ?? ''}` };
  const name = project();
  if (name) headers['X-Parsyn-Project'] = name;
  return { ...headers, ...extra };
}

/** @param {Response} response @returns {Promise<ApiError>} */
async function errorFrom(response) {
  const text = await response.text();
  let code = `http_${response.status}`;
  let message = text || response.statusText;
  let errors = [];
  try {
    const body = JSON.parse(text);
    if (body && body.error) {
      code = body.error.code ?? code;
      message = body.error.message ?? message;
      if (Array.isArray(body.error.errors)) errors = body.error.errors;
    }
  } catch {
    // Not JSON (a proxy's page): keep the text.
  }
  return new ApiError(response.status, code, message, errors);
}

// JSON request to /api/v1`path`; resolves to the parsed body (null for 204), rejects with ApiError.
/** @param {string} method @param {string} path @param {unknown} [body] @returns {Promise<any>} */
export async function api(method, path, body) {
  /** @type {{method: string, headers: Record<string, string>, body?: string}} */
  const init = { method, headers: authHeaders() };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(`/api/v1${path}`, init);
  if (!response.ok) {
    const error = await errorFrom(response);
    if (response.status === 401) onUnauthenticated(error);
    throw error;
  }
  if (response.status === 204) return null;
  return response.json();
}

// Every item of the list at /api/v1`path` (answers {"<field>": [...], "next_cursor"}), following next_cursor page by
// page (docs/openapi.yaml, "Pagination"); resolves to {"<field>": [all items]}.
/** @param {string} path @param {string} field @returns {Promise<Record<string, any[]>>} */
export async function listAll(path, field) {
  /** @type {any[]} */
  const items = [];
  /** @type {string | null} */
  let cursor = null;
  do {
    const separator = path.includes('?') ? '&' : '?';
    const page = await api('GET', `${path}${separator}limit=1000${cursor === null ? '' : `&cursor=${encodeURIComponent(cursor)}`}`);
    items.push(...page[field]);
    cursor = page.next_cursor ?? null;
  } while (cursor !== null);
  return { [field]: items };
}

// Downloads /api/v1`path` with the key and hands it to the browser as a file named `filename`.
/** @param {string} path @param {string} filename */
export async function download(path, filename) {
  const response = await fetch(`/api/v1${path}`, { headers: authHeaders() });
  if (!response.ok) throw await errorFrom(response);
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement('a');
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// Parses one SSE block ("event: x\ndata: ...\nid: n") into {type, data, id}; null for comments only.
/** @param {string} block @returns {{type: string, data: any, id: string | null} | null} */
function parseEventBlock(block) {
  let type = 'message';
  /** @type {string | null} */
  let id = null;
  /** @type {string[]} */
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line === '' || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') type = value;
    else if (field === 'data') data.push(value);
    else if (field === 'id') id = value;
  }
  if (data.length === 0) return null;
  let parsed;
  try {
    parsed = JSON.parse(data.join('\n'));
  } catch {
    return null;
  }
  return { type, data: parsed, id };
}

// Follows a job's events stream: every stored event from the start, then live ones, reconnecting with
// Last-Event-ID after a dropped connection. onEvent(type, data) runs for each; `isDone()` is asked after each event
// and when the server ends the stream (it ends after the job's terminal status). Returns a function that stops it.
/**
 * @typedef {(type: string, data: any) => void} EventHandler
 * @typedef {(open: boolean, error?: ApiError) => void} ConnectionHandler
 */
/**
 * @param {number} jobId @param {EventHandler} onEvent
 * @param {{isDone?: () => boolean, onConnection?: ConnectionHandler}} [options]
 * @returns {() => void}
 */
export function followJobEvents(jobId, onEvent, { isDone, onConnection = () => {} } = {}) {
  // ?after=0: the whole history, worker progress included (the loss curves); a reconnect's Last-Event-ID wins.
  return followStream(`/training-jobs/${jobId}/events?after=0`, onEvent, { isDone, onConnection });
}

// Follows GET /api/v1/events, the stream of job, round and worker changes across all jobs (docs/architecture.md,
// "Event streams"). It starts with a "reset" event (and sends one again when it cannot resume where this client
// left off, e.g. after a coordinator restart): re-read the lists then, and patch them from the events that follow.
// onConnection(false) when the stream drops (the caller re-reads meanwhile) or is refused (with the error, e.g. a
// coordinator that is not the leader answers 503), so the caller falls back to re-reading on a timer.
/** @param {EventHandler} onEvent @param {{onConnection?: ConnectionHandler}} [options] @returns {() => void} */
export function followAllEvents(onEvent, { onConnection = () => {} } = {}) {
  return followStream('/events', onEvent, { onConnection });
}

// Keeps a list page current from GET /api/v1/events. `load()` (re-)reads the whole list and draws it (it reports its
// own errors); `apply(type, data, reload)` patches the list from one event, calling `reload()` when it meets
// something it has not seen. The stream's `reset` (sent first, and after a restart) reloads; events that arrive during
// a load are applied after it. While the stream is down the list is re-read every `fallbackMs` (and at once), and
// `onUnavailable(error)` is told when the server refused the stream. Returns a function that stops it all.
/**
 * @param {{load: () => Promise<void>, apply: (type: string, data: any, reload: () => Promise<void>) => void,
 *   fallbackMs: number, onUnavailable?: (error: ApiError) => void}} options
 * @returns {() => void}
 */
export function followListLive({ load, apply, fallbackMs, onUnavailable = () => {} }) {
  let stopped = false;
  /** @type {Promise<void> | null} */
  let loading = null;   // the running load, if any
  /** @type {[string, any][]} */
  let queued = [];      // events that came during it
  /** @type {ReturnType<typeof setInterval> | undefined} */
  let fallbackTimer = undefined;

  /** @returns {Promise<void>} */
  function reload() {
    if (loading) return loading;
    loading = (async () => {
      try {
        await load();
      } catch (_) {
        // load() shows its own errors; the next reset, event or fallback tick tries again
      }
      loading = null;
      const pending = queued;
      queued = [];
      for (const [type, data] of pending) handle(type, data);
    })();
    return loading;
  }
  /** @type {EventHandler} */
  function handle(type, data) {
    if (stopped) return;
    if (type === 'reset') {
      reload();
      return;
    }
    if (loading) {
      queued.push([type, data]);
      return;
    }
    apply(type, data, reload);
  }
  function stopFallback() {
    clearInterval(fallbackTimer);
    fallbackTimer = undefined;
  }
  const unfollow = followAllEvents(handle, {
    onConnection(up, error) {
      if (up) {
        stopFallback();
        return;
      }
      // Dropped (it reconnects by itself and resumes) or refused: re-read meanwhile.
      reload();
      if (fallbackTimer === undefined && !stopped) fallbackTimer = setInterval(reload, fallbackMs);
      if (error) onUnavailable(error);
    },
  });
  return () => {
    stopped = true;
    unfollow();
    stopFallback();
  };
}

/**
 * @param {string} path @param {EventHandler} onEvent
 * @param {{isDone?: () => boolean, onConnection?: ConnectionHandler}} [options]
 * @returns {() => void}
 */
function followStream(path, onEvent, { isDone, onConnection = () => {} } = {}) {
  const controller = new AbortController();
  /** @type {string | null} */
  let lastId = null;
  let stopped = false;

  async function readOnce() {
    const headers = authHeaders({ Accept: 'text/event-stream' });
    if (lastId !== null) headers['Last-Event-ID'] = lastId;
    const response = await fetch(`/api/v1${path}`, { headers, signal: controller.signal });
    if (!response.ok) {
      const error = await errorFrom(response);
      if (response.status === 401) onUnauthenticated(error);
      throw error;
    }
    onConnection(true);
    const reader = /** @type {ReadableStream<Uint8Array>} */ (response.body).getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
        const event = parseEventBlock(block);
        if (!event) continue;
        if (event.id !== null) lastId = event.id;
        onEvent(event.type, event.data);
      }
    }
  }

  (async () => {
    let delay = 500;
    while (!stopped) {
      try {
        await readOnce();
        delay = 500;
      } catch (error) {
        if (stopped || /** @type {Error} */ (error).name === 'AbortError') return;
        if (error instanceof ApiError && error.status < 500) {
          onConnection(false, error);
          return;  // not found, bad key: retrying will not help
        }
      }
      if (stopped || (isDone && isDone())) return;
      onConnection(false);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();

  return () => {
    stopped = true;
    controller.abort();
  };
}
