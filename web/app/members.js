// Members page (#/members): the current project's members and their roles (GET /api/v1/projects/{id}). Its owners
// add a member or change a role, and remove members; anyone may leave it (the last owner cannot: the server says so).
import { api } from './api.js';
import { h, replaceKeepingFocus } from './dom.js';
import { currentProject, loadProjects } from './projects.js';

/** @typedef {{user_id: number, name: string, role: string}} Member */

/** @param {HTMLElement} container @param {string[]} _params @param {() => void} reroute */
export function render(container, _params, reroute = () => {}) {
  const current = currentProject();
  if (!current) {
    container.append(h('h1', {}, 'Members'), h('p', { id: 'no-project', class: 'notice' },
      'You are not a member of any project yet: ask a platform admin or a project\'s owner to add you.'));
    return undefined;
  }
  const owner = current.role === 'owner';
  const error = h('p', { class: 'field-error', role: 'alert', id: 'members-error' });
  const body = h('tbody');
  const user = h('input', { id: 'member-user', required: true, maxlength: 64, placeholder: 'user name' });
  const role = h('select', { id: 'member-role' }, ...['viewer', 'editor', 'owner'].map((r) => h('option', { value: r }, r)));
  const form = h('form', { id: 'member-form', class: 'audit-filters', novalidate: true, hidden: !owner },
    h('label', { for: 'member-user' }, 'User'), user,
    h('label', { for: 'member-role' }, 'Role'), role,
    h('button', { type: 'submit', class: 'primary' }, 'Add or change'));
  const leave = h('button', { type: 'button', id: 'leave-project', class: 'danger' }, 'Leave this project');
  container.append(
    h('div', { class: 'page-head' }, h('h1', {}, `Members of ${current.name}`)),
    h('p', { class: 'muted' }, `Your role: ${current.role}. Viewers read; editors also change datasets, models, ` +
      'workers and jobs; owners also manage the members.'),
    form, error,
    h('div', { class: 'table-wrap' },
      h('table', { id: 'members-table' },
        h('thead', {}, h('tr', {}, ...['User', 'Role', ''].map((t) => h('th', { scope: 'col' }, t)))),
        body)),
    leave,
  );
  let stopped = false;
  const path = `/projects/${current.id}`;

  /** @param {Error} err @param {string} what */
  const say = (err, what) => {
    error.textContent = `Could not ${what}: ${err.message}`;
  };

  async function load() {
    try {
      const { members } = await api('GET', path);
      if (stopped) return;
      replaceKeepingFocus(body, members.map((/** @type {Member} */ m) => {
        const remove = h('button', { type: 'button', class: 'danger', 'aria-label': `Remove ${m.name}`, hidden: !owner },
          'Remove');
        remove.addEventListener('click', async () => {
          try {
            await api('DELETE', `${path}/members/${m.user_id}`);
            load();
          } catch (err) {
            say(/** @type {Error} */ (err), `remove ${m.name}`);
          }
        });
        return h('tr', { 'data-user': m.name, 'data-role': m.role }, h('td', {}, m.name), h('td', {}, m.role),
          h('td', {}, remove));
      }));
    } catch (err) {
      if (!stopped) say(/** @type {Error} */ (err), 'load the members');
    }
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    try {
      await api('POST', `${path}/members`, { user: user.value.trim(), role: /** @type {HTMLSelectElement} */ (role).value });
      user.value = '';
      load();
    } catch (err) {
      say(/** @type {Error} */ (err), 'change the members');
    }
  });
  leave.addEventListener('click', async () => {
    if (!confirm(`Leave ${current.name}? You will no longer see its datasets, models, workers and jobs.`)) return;
    try {
      await api('DELETE', `${path}/membership`);
      await loadProjects();
      reroute();
    } catch (err) {
      say(/** @type {Error} */ (err), 'leave');
    }
  });
  load();
  return () => {
    stopped = true;
  };
}
