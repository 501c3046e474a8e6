// The dashboard's shell: sign-in with the API key, the navigation with its project switcher, and a hash router
// (#/training, #/jobs/new, #/jobs/<id>, #/workers, #/members, #/audit, #/keys). Each page is a module exporting
// render(container, params, reroute) -> cleanup function.
import { api, apiKey, cookie, setApiKey, setUnauthenticatedHandler, ApiError, SSO_SESSION } from './api.js';
import { h } from './dom.js';
import * as training from './training.js';
import * as newJob from './new_job.js';
import * as jobDetail from './job_detail.js';
import * as workers from './workers.js';
import * as audit from './audit.js';
import * as keys from './keys.js';
import * as members from './members.js';
import { currentProject, forgetProjects, loadedProjects, loadProjects, projectSwitcher } from './projects.js';

// index.html has both.
const main = /** @type {HTMLElement} */ (document.getElementById('main'));
const nav = /** @type {HTMLElement} */ (document.getElementById('nav'));
const switcher = /** @type {HTMLElement} */ (document.getElementById('project-switcher'));
/** @type {(() => void) | null} */
let cleanup = null;
let signingIn = false;  // a 401 while trying a key is the form's answer, not a lost session

/**
 * @typedef {{render: (container: HTMLElement, params: string[], reroute: () => void) => (() => void) | undefined}} Page
 * @type {{pattern: RegExp, page: Page, title: string, nav: string, inProject?: boolean}[]}
 */
const ROUTES = [
  { pattern: /^#\/training$/, page: training, title: 'Training', nav: 'training', inProject: true },
  { pattern: /^#\/jobs\/new$/, page: newJob, title: 'New training job', nav: 'new', inProject: true },
  { pattern: /^#\/jobs\/(\d+)$/, page: jobDetail, title: 'Training job', nav: 'training', inProject: true },
  { pattern: /^#\/workers$/, page: workers, title: 'Workers', nav: 'workers', inProject: true },
  { pattern: /^#\/members$/, page: members, title: 'Members', nav: 'members' },
  { pattern: /^#\/audit$/, page: audit, title: 'Audit log', nav: 'audit' },
  { pattern: /^#\/keys$/, page: keys, title: 'API keys', nav: 'keys' },
];

/** @param {string} [message] */
function showSignIn(message) {
  if (cleanup) cleanup();
  cleanup = null;
  nav.hidden = true;
  document.title = 'Sign in · Parsyn';
  const input = h('input', { id: 'api-key', type: 'password', autocomplete: 'current-password', required: true,
                             'aria-describedby': 'sign-in-error' });
  const error = h('p', { id: 'sign-in-error', class: 'field-error', role: 'alert' }, message ?? '');
  const button = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h(
    'form',
    { class: 'card sign-in', novalidate: true },
    h('h1', {}, 'Parsyn'),
    h('p', { class: 'muted' }, 'Enter the admin API key that `parsyn server` printed on its first start ' +
      '(also in the file admin-key in its data directory), or your own key (`parsyn key create`). ' +
      'It is kept for this browser tab only.'),
    h('label', { for: 'api-key' }, 'API key'),
    input,
    error,
    button,
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const key = input.value.trim();
    if (!key) {
      error.textContent = 'Enter the API key.';
      return;
    }
    button.disabled = true;
    error.textContent = '';
    setApiKey(key);
    signingIn = true;
    try {
      await loadProjects();  // any user's route: tells a wrong key apart, and lists the projects to choose from
      signingIn = false;
      if (!ROUTES.some((r) => r.pattern.test(location.hash))) history.replaceState(null, '', '#/training');
      route(true);
    } catch (err) {
      signingIn = false;
      setApiKey(null);
      error.textContent = !(err instanceof ApiError) || err.status >= 500
        ? `Could not reach the server: ${/** @type {Error} */ (err).message}`
        : `That key was not accepted: ${err.message}`;
      button.disabled = false;
      input.focus();
    }
  });
  main.replaceChildren(form);
  input.focus();
  offerSingleSignOn(form);
}

// When the server has single sign-on, the sign-in form offers it: the provider's page, then back here.
/** @param {HTMLElement} form */
async function offerSingleSignOn(form) {
  const answer = await fetch('/api/v1/auth/oidc').catch(() => null);
  if (!answer || !answer.ok) return;
  const { issuer } = await answer.json();
  const returnTo = `/${location.hash.startsWith('#/') ? location.hash : '#/training'}`;
  form.append(h('p', { class: 'muted' }, 'or'),
    h('a', { class: 'button', id: 'sso-sign-in', href: `/api/v1/auth/oidc/login?return_to=${encodeURIComponent(returnTo)}` },
      `Sign in with single sign-on (${issuer})`));
}

function route(moveFocus = false) {
  if (!apiKey()) {
    showSignIn();
    return;
  }
  if (loadedProjects() === null) {  // a reload: read the projects first
    loadProjects().then(() => route(moveFocus), (err) => {
      if (!(err instanceof ApiError) || err.status !== 401) main.replaceChildren(h('p', { class: 'field-error' },
        `Could not reach the server: ${/** @type {Error} */ (err).message}`));
    });
    return;
  }
  const match = ROUTES.map((r) => ({ r, m: r.pattern.exec(location.hash) })).find((x) => x.m);
  if (!match) {
    location.replace('#/training');
    return;
  }
  if (cleanup) cleanup();
  nav.hidden = false;
  for (const link of /** @type {NodeListOf<HTMLElement>} */ (nav.querySelectorAll('a[data-nav]'))) {
    if (link.dataset.nav === match.r.nav) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  switcher.replaceChildren(projectSwitcher(() => route()));
  document.title = `${match.r.title} · Parsyn`;
  const container = h('div', { class: 'page' });
  main.replaceChildren(container);
  if (match.r.inProject && currentProject() === null) {
    container.append(h('h1', {}, match.r.title), h('p', { id: 'no-project', class: 'notice' },
      'You are not a member of any project yet: ask a platform admin or a project\'s owner to add you. ' +
      'Your API keys are on the "API keys" page.'));
    cleanup = null;
  } else {
    cleanup = match.r.page.render(container, /** @type {RegExpExecArray} */ (match.m).slice(1), () => route()) ?? null;
  }
  // After a navigation the keyboard continues from the new page's content (the first load keeps the natural order).
  if (moveFocus) main.focus({ preventScroll: true });
}

setUnauthenticatedHandler(() => {
  if (signingIn) return;
  setApiKey(null);
  forgetProjects();
  showSignIn('The server no longer accepts the key: sign in again.');
});

/** @type {HTMLElement} */ (document.getElementById('sign-out')).addEventListener('click', async () => {
  // A single sign-on session ends at the server too: its key is revoked and its cookies cleared.
  if (apiKey() === SSO_SESSION) await api('POST', '/auth/logout').catch(() => {});
  setApiKey(null);
  forgetProjects();
  showSignIn('Signed out.');
});

// Back from the provider: the session's cookies are set (the CSRF one is readable).
if (!apiKey() && cookie('parsyn_csrf')) setApiKey(SSO_SESSION);

window.addEventListener('hashchange', () => route(true));
route();
