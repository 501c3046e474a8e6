// The signed-in user's projects (GET /api/v1/projects, each with the user's role) and the one the dashboard acts in
// (api.js project(): every request names it). The navigation's switcher changes it.
import { api, project, setProject } from './api.js';
import { h } from './dom.js';

/** @typedef {{id: number, name: string, role: 'viewer' | 'editor' | 'owner'}} Project */

/** @type {Project[] | null} */
let projects = null;

// Reads the user's projects, and keeps the chosen one when it is among them, else takes "default", else the first.
/** @returns {Promise<Project[]>} */
export async function loadProjects() {
  const answer = await api('GET', '/projects');
  projects = answer.projects;
  const list = /** @type {Project[]} */ (projects);
  if (!list.some((p) => p.name === project())) {
    setProject((list.find((p) => p.name === 'default') ?? list[0])?.name ?? null);
  }
  return list;
}

// The projects read last; null before the first loadProjects.
export function loadedProjects() {
  return projects;
}

// The project the dashboard acts in; null when the user is a member of none.
/** @returns {Project | null} */
export function currentProject() {
  return projects?.find((p) => p.name === project()) ?? null;
}

// Forgets the list (a sign-out).
export function forgetProjects() {
  projects = null;
  setProject(null);
}

// The switcher: a select of the user's projects; choosing one calls `onChange` after the dashboard acts in it.
/** @param {() => void} onChange */
export function projectSwitcher(onChange) {
  const select = /** @type {HTMLSelectElement} */ (h('select', { id: 'project-select', 'aria-label': 'Project' },
    ...(projects ?? []).map((p) => h('option', { value: p.name }, `${p.name} (${p.role})`))));
  select.value = project() ?? '';
  select.addEventListener('change', () => {
    setProject(select.value);
    onChange();
  });
  return select;
}
