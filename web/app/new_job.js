// New job form: name, dataset and model from the live lists, the config fields, and an Advanced section with the
// distributed settings and worker selection. Blank fields are left out so the server's defaults apply; the server
// validates everything and lists its problems by field (error.errors: {field, message}), each shown next to its field.
import { api, ApiError, listAll } from './api.js';
import { h } from './dom.js';

/**
 * A form field: [path, label, kind, placeholder (a bool's: its state), select options, help, partition methods it
 * shows for].
 * @typedef {[string, string, string, string | boolean, (string[] | null)?, (string | null)?, string[]?]} FieldRow
 * @typedef {import('./training_defaults.js').Strategy} Strategy
 * @typedef {import('./training_defaults.js').DistributedDefaults} DistributedDefaults
 */

// The config fields: [key, label, kind, options, help]. kind: int | number | text | list | intlist | bool | select. Their
// defaults come from the server's schema (src/protocol/training_config.h), generated at build time into
// training_defaults.js and embedded with the app; the form holds no copy of its own.
/** @type {[string, string, string, (string[] | null)?, string?][]} */
const CONFIG_KEYS = [
  ['epochs', 'Epochs', 'int'],
  ['batch_size', 'Batch size', 'int'],
  ['learning_rate', 'Learning rate', 'number'],
  ['mixed_precision', 'Mixed precision', 'select', ['no', 'bf16', 'fp16']],
  ['use_peft', 'LoRA adapters (PEFT)', 'bool'],
  // An int field passes text that is not a number on as typed: "auto" reaches the server as config.lora_r "auto".
  ['lora_r', 'LoRA rank', 'int', null, 'a rank, or auto: each worker\'s rank from the memory it announces'],
  ['lora_alpha', 'LoRA alpha', 'number'],
  ['lora_dropout', 'LoRA dropout', 'number'],
  ['lora_target_modules', 'LoRA target modules', 'list'],
  ['max_seq_len', 'Max sequence length', 'int'],
  ['weight_decay', 'Weight decay', 'number'],
  ['warmup_steps', 'Warm-up steps', 'int'],
  ['lr_scheduler', 'LR scheduler', 'select', ['linear', 'constant', 'cosine']],
  ['gradient_accumulation_steps', 'Gradient accumulation steps', 'int'],
  ['max_grad_norm', 'Max gradient norm', 'number'],
  ['seed', 'Seed', 'int'],
  ['validation_fraction', 'Validation fraction', 'number'],
  ['label_column', 'Label column (CSV)', 'text'],
  ['hidden_sizes', 'Hidden layer sizes (tabular)', 'intlist'],
  ['trainer', 'Trainer (a name its workers offer)', 'text'],
];

// What an empty default means, where the bare value would not say it.
/** @type {Record<string, string>} */
const EMPTY_DEFAULT_SHOWN = { label_column: 'label', hidden_sizes: 'none: logistic' };

// The rows fieldControl takes: [path, label, kind, default shown as placeholder (a bool's is its state), options].
/** @param {Readonly<Record<string, unknown>>} defaults @returns {FieldRow[]} */
export function configFields(defaults) {
  return CONFIG_KEYS.map(([key, label, kind, options, help]) => {
    const value = defaults[key];
    let shown;
    if (kind === 'bool') shown = value === true;
    else if (Array.isArray(value)) shown = value.length ? value.join(', ') : (EMPTY_DEFAULT_SHOWN[key] ?? '');
    else if (value === '' || value === undefined) shown = EMPTY_DEFAULT_SHOWN[key] ?? '';
    else shown = String(value);
    return [`config.${key}`, label, kind, shown, options, help ?? null];
  });
}

// distributed.strategy_options' labels and kinds: [label, kind]. Which strategies take which option, and each
// option's default, come from the C++ strategy registry (STRATEGIES in training_defaults.js, generated with the config's
// defaults; docs/training.md "Strategies"); every strategy also takes sample_fraction or sample_count.
/** @type {Record<string, [string, string]>} */
const OPTION_LABELS = {
  mu: ['μ (proximal term)', 'number'],
  server_learning_rate: ['Server learning rate', 'number'],
  server_momentum: ['Server momentum', 'number'],
  beta1: ['β1', 'number'],
  beta2: ['β2', 'number'],
  tau: ['τ (adaptivity)', 'number'],
  beta: ['β (trimmed fraction per side)', 'number'],
  f: ['f (Byzantine workers tolerated)', 'int'],
  m: ['m (updates averaged)', 'int'],
  clip_norm: ['Clip norm (L2)', 'number'],
  noise_multiplier: ['Noise multiplier', 'number'],
  delta: ['δ (privacy)', 'number'],
};
/** @type {[string, string, string][]} */
const SAMPLING_FIELDS = [
  ['sample_fraction', 'Sample fraction of workers per round', 'number'],
  ['sample_count', 'Sample count of workers per round', 'int'],
];
const SAMPLING_OPTIONS = new Set(SAMPLING_FIELDS.map(([option]) => option));
// What an option without a default (null) becomes, where "required" would not say it.
/** @type {Record<string, string>} */
const NULL_DEFAULT_SHOWN = { m: 'n − f' };

// A default as the form shows it: 1e-9 rather than 0.000000001.
const shownNumber = (/** @type {number} */ v) => (v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential() : String(v));

// From the generated catalog ([{name, options: [{name, default, required}]}]): the strategies' names in order, the
// options each takes with the placeholder its default gives ({fedadam: {server_learning_rate: '0.1', ...}}), and
// every option's field [option, label, kind] (in the order the strategies first name them, then the sampling pair).
/**
 * @param {readonly Strategy[]} catalog
 * @returns {{names: string[], options: Record<string, Record<string, string>>, fields: [string, string, string][]}}
 */
export function strategyChoices(catalog) {
  const names = catalog.map((s) => s.name);
  const options = Object.fromEntries(catalog.map((s) => [s.name, Object.fromEntries(s.options.map((o) => [o.name,
    o.required ? 'required' : o.default === null ? NULL_DEFAULT_SHOWN[o.name] ?? '' : shownNumber(o.default)]))]));
  const optionNames = [...new Set(catalog.flatMap((s) => s.options.map((o) => o.name)))];
  /** @type {[string, string, string][]} */
  const fields = [...optionNames.map((o) => /** @type {[string, string, string]} */ ([o, ...(OPTION_LABELS[o] ?? [o, 'number'])])),
    ...SAMPLING_FIELDS];
  return { names, options, fields };
}

// distributed.partition (docs/training.md "Data partition"): [path, label, kind, placeholder, options, help, methods].
// The defaults shown are a distributed job's, generated from C++ (DISTRIBUTED_DEFAULTS in training_defaults.js).
export const PARTITION_METHODS = ['iid', 'dirichlet', 'shards_per_worker'];
/** @param {DistributedDefaults} defaults @returns {FieldRow[]} */
export const partitionFields = (defaults) => [
  ['distributed.partition.method', 'Data partition', 'select', defaults.partition.method, PARTITION_METHODS,
    'how the dataset is split over the workers'],
  ['distributed.partition.alpha', 'Dirichlet α', 'number', String(defaults.partition.alpha), null, 'smaller: more label skew',
    ['dirichlet']],
  ['distributed.partition.classes_per_worker', 'Classes per worker', 'int', String(defaults.partition.classes_per_worker),
    null, null, ['shards_per_worker']],
  ['distributed.partition.label', 'Label', 'text', 'CSV: the label column', null,
    'JSONL: the record field holding the class (required unless iid)'],
];

/** @param {string[]} strategies @param {DistributedDefaults} defaults @returns {FieldRow[]} */
export const distributedFields = (strategies, defaults) => [
  ['distributed.enabled', 'Distributed training', 'bool', false],
  ['distributed.strategy', 'Strategy', 'select', defaults.strategy, strategies],
  ['distributed.num_rounds', 'Rounds', 'int', String(defaults.num_rounds)],
  ['distributed.steps_per_round', 'Steps per round', 'int', String(defaults.steps_per_round), null,
    '0: a round trains the epochs over the shard'],
  ['distributed.min_workers', 'Min workers', 'int', String(defaults.min_workers)],
  ['distributed.max_workers', 'Max workers', 'int', 'min workers'],
  ['distributed.aggregation_timeout', 'Aggregation timeout (s)', 'number', String(defaults.aggregation_timeout)],
  ['distributed.fault_tolerance', 'Fault tolerance (failed rounds)', 'int', String(defaults.fault_tolerance)],
  ['distributed.join_window', 'Join window (s)', 'number', String(defaults.join_window), null,
    'how long a round waits for workers still reporting'],
];

const fieldId = (/** @type {string} */ path) => `f-${path.replaceAll('.', '-')}`;
const errorId = (/** @type {string} */ path) => `err-${path.replaceAll('.', '-')}`;

/** @param {FieldRow} row */
function fieldControl([path, label, kind, placeholder, options, help]) {
  let control;
  if (kind === 'bool') {
    control = h('input', { type: 'checkbox', id: fieldId(path), name: path, checked: placeholder === true });
  } else if (kind === 'select') {
    control = h('select', { id: fieldId(path), name: path },
      .../** @type {string[]} */ (options).map((o) => h('option', { value: o, selected: o === placeholder }, o)));
  } else {
    control = h('input', {
      id: fieldId(path), name: path, placeholder,
      type: 'text', inputmode: kind === 'int' || kind === 'intlist' ? 'numeric' : kind === 'number' ? 'decimal' : null,
    });
  }
  control.dataset.kind = kind;
  control.setAttribute('aria-describedby', errorId(path));
  const error = h('p', { class: 'field-error', id: errorId(path) });
  if (kind === 'bool') {
    return h('div', { class: 'field field-check' }, h('label', {}, control, ' ', label), error);
  }
  return h('div', { class: 'field' },
    h('label', { for: fieldId(path) }, label), control, help ? h('p', { class: 'help' }, help) : null, error);
}

// The value to send for a control, or undefined to leave the field out (server default).
/** @param {HTMLInputElement | HTMLSelectElement} control */
function readControl(control) {
  const kind = control.dataset.kind;
  if (kind === 'bool') return /** @type {HTMLInputElement} */ (control).checked;
  const text = control.value.trim();
  if (kind === 'select') return text;
  if (text === '') return undefined;
  if (kind === 'int' || kind === 'number') {
    const n = Number(text);
    return Number.isFinite(n) ? n : text;  // a non-number goes as typed: the server names the field
  }
  if (kind === 'list') return text.split(',').map((s) => s.trim()).filter(Boolean);
  if (kind === 'intlist') return text.split(',').map((s) => s.trim()).filter(Boolean).map((s) => (Number.isFinite(Number(s)) ? Number(s) : s));
  return text;
}

/** @param {Record<string, any>} object @param {string} path @param {unknown} value */
function setPath(object, path, value) {
  const parts = path.split('.');
  let at = object;
  for (const p of parts.slice(0, -1)) at = at[p] ??= {};
  at[/** @type {string} */ (parts.at(-1))] = value;
}

// The form field of each problem the server listed ({field, message}; field null when it is about no one field):
// its field path with an array index dropped ("config.lora_target_modules[1]" goes to config.lora_target_modules)
// when the form has that field, else null (shown with the form). Returns [{path | null, message}].
/**
 * @param {{field: string | null, message: string}[]} problems @param {Set<string>} knownPaths
 * @returns {{path: string | null, message: string}[]}
 */
export function problemsByField(problems, knownPaths) {
  return problems.map(({ field, message }) => {
    const path = typeof field === 'string' ? field.replace(/(\[\d+\])+$/, '') : null;
    return { path: path !== null && knownPaths.has(path) ? path : null, message };
  });
}

// training_defaults.js exists only among the embedded assets (generated at build time), so it is imported when the
// form is first shown rather than with this module, which tests/web imports from the source tree.
/** @param {HTMLElement} container */
export function render(container) {
  let stopped = false;
  /** @type {(() => void) | null} */
  let cleanup = null;
  import('./training_defaults.js')
    .then(({ TRAINING_DEFAULTS, STRATEGIES, DISTRIBUTED_DEFAULTS }) => {
      if (!stopped) {
        cleanup = renderForm(container, configFields(TRAINING_DEFAULTS), strategyChoices(STRATEGIES), DISTRIBUTED_DEFAULTS);
      }
    })
    .catch((err) => {
      if (!stopped) container.append(h('p', { class: 'form-error', role: 'alert' }, `Could not load the form: ${err.message}`));
    });
  return () => {
    stopped = true;
    cleanup?.();
  };
}

/**
 * @param {HTMLElement} container @param {FieldRow[]} configRows
 * @param {ReturnType<typeof strategyChoices>} strategies @param {DistributedDefaults} distributedDefaults
 */
function renderForm(container, configRows, strategies, distributedDefaults) {
  const DISTRIBUTED_FIELDS = distributedFields(strategies.names, distributedDefaults);
  const PARTITION_FIELDS = partitionFields(distributedDefaults);
  /** @type {FieldRow[]} */
  const optionRows = strategies.fields.map(([option, label, kind]) => [`distributed.strategy_options.${option}`, label, kind, '']);
  const form = h('form', { id: 'job-form', class: 'card form', novalidate: true });
  const formError = h('div', { class: 'form-error', role: 'alert', id: 'form-error' });
  const listsError = h('p', { class: 'field-error', role: 'status' });
  const datasetSelect = h('select', { id: fieldId('dataset_id'), name: 'dataset_id', 'aria-describedby': errorId('dataset_id') });
  const modelSelect = h('select', { id: fieldId('model_id'), name: 'model_id', 'aria-describedby': errorId('model_id') });
  const ownList = h('div', { class: 'worker-picks', id: 'own-workers', role: 'group', 'aria-label': 'Own workers' });
  const managedList = h('div', { class: 'worker-picks', id: 'managed-workers', role: 'group', 'aria-label': 'Managed workers' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create job');

  const basic = h('fieldset', {}, h('legend', {}, 'Job'),
    h('div', { class: 'field' }, h('label', { for: fieldId('name') }, 'Name'),
      h('input', { id: fieldId('name'), name: 'name', type: 'text', 'aria-describedby': errorId('name'), autocomplete: 'off' }),
      h('p', { class: 'field-error', id: errorId('name') })),
    h('div', { class: 'field' }, h('label', { for: fieldId('dataset_id') }, 'Dataset'), datasetSelect,
      h('p', { class: 'field-error', id: errorId('dataset_id') })),
    h('div', { class: 'field' }, h('label', { for: fieldId('model_id') }, 'Model'), modelSelect,
      h('p', { class: 'field-error', id: errorId('model_id') })));

  const config = h('fieldset', {}, h('legend', {}, 'Training configuration'),
    h('div', { class: 'grid-fields' }, ...configRows.map(fieldControl)));

  const advanced = h('details', { id: 'advanced' },
    h('summary', {}, 'Advanced: distributed training and worker selection'),
    h('fieldset', {}, h('legend', {}, 'Distributed settings'),
      h('div', { class: 'grid-fields' }, ...DISTRIBUTED_FIELDS.map(fieldControl))),
    h('fieldset', { id: 'strategy-options' }, h('legend', {}, 'Strategy options'),
      h('p', { class: 'help', id: 'strategy-options-none' }, 'This strategy takes no options besides sampling.'),
      h('div', { class: 'grid-fields' }, ...optionRows.map(fieldControl))),
    h('fieldset', { id: 'partition' }, h('legend', {}, 'Data partition (platform datasets)'),
      h('div', { class: 'grid-fields' }, ...PARTITION_FIELDS.map(fieldControl))),
    h('fieldset', {}, h('legend', {}, 'Worker selection'),
      fieldControl(['worker_selection.mode', 'Mode', 'select', 'auto', ['auto', 'own', 'managed', 'mixed']]),
      h('div', { class: 'picks-row' },
        h('div', {}, h('h3', {}, 'Own workers'), ownList,
          h('p', { class: 'field-error', id: errorId('worker_selection.worker_ids') })),
        h('div', {}, h('h3', {}, 'Managed workers'), managedList,
          h('p', { class: 'field-error', id: errorId('worker_selection.parsyn_worker_ids') })))));

  form.append(formError, listsError, basic, config, advanced, h('div', { class: 'actions' }, submit));
  container.append(h('div', { class: 'page-head' }, h('h1', {}, 'New training job')), form);

  const knownPaths = new Set(['name', 'dataset_id', 'model_id', 'worker_selection.mode', 'worker_selection.worker_ids',
    'worker_selection.parsyn_worker_ids', ...configRows.map((f) => f[0]), ...DISTRIBUTED_FIELDS.map((f) => f[0]),
    ...optionRows.map((f) => f[0]), ...PARTITION_FIELDS.map((f) => f[0])]);

  // Only the chosen strategy's options and the chosen partition method's settings are shown (and sent).
  // Every path named here has its field (fieldControl made them above).
  const fieldOf = (/** @type {string} */ path) =>
    /** @type {HTMLElement} */ (form.querySelector(`#${fieldId(path)}`)?.closest('.field'));
  const strategySelect = /** @type {HTMLSelectElement} */ (form.querySelector(`#${fieldId('distributed.strategy')}`));
  const methodSelect = /** @type {HTMLSelectElement} */ (form.querySelector(`#${fieldId('distributed.partition.method')}`));
  function showChosen() {
    const strategy = strategySelect.value;
    const takes = strategies.options[strategy] ?? {};
    for (const [option] of strategies.fields) {
      const field = fieldOf(`distributed.strategy_options.${option}`);
      field.hidden = !SAMPLING_OPTIONS.has(option) && !Object.hasOwn(takes, option);
      const control = /** @type {HTMLInputElement} */ (field.querySelector('input'));
      control.placeholder = takes[option] ?? '';
    }
    /** @type {HTMLElement} */ (form.querySelector('#strategy-options-none')).hidden = Object.keys(takes).length > 0;
    for (const row of PARTITION_FIELDS) {
      if (row[6]) fieldOf(row[0]).hidden = !row[6].includes(methodSelect.value);
    }
  }
  strategySelect.addEventListener('change', showChosen);
  methodSelect.addEventListener('change', showChosen);
  showChosen();

  // Live lists, re-read every 3 s (keeping what is chosen and ticked).
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer = undefined;
  let stopped = false;
  async function loadLists() {
    try {
      const [{ datasets }, { models }] = await Promise.all([listAll('/datasets', 'datasets'), listAll('/models', 'models')]);
      // Rebuilt only when the list changed, so an open dropdown or the keyboard focus is not disturbed.
      /** @param {HTMLSelectElement} select @param {{id: number}[]} items @param {(item: any) => string} describe */
      const fill = (select, items, describe) => {
        const signature = JSON.stringify(items.map((it) => [it.id, describe(it)]));
        if (select.dataset.signature === signature) return;
        select.dataset.signature = signature;
        const keep = select.value;
        select.replaceChildren(h('option', { value: '' }, items.length ? 'Choose…' : 'None uploaded yet'),
          ...items.map((it) => h('option', { value: it.id }, describe(it))));
        if (keep) select.value = keep;
        if (!select.value && items.length === 1) select.value = String(items[0].id);
      };
      fill(datasetSelect, datasets, (d) => `${d.name} (#${d.id}, ${d.kind}, ${d.row_count} rows)`);
      fill(modelSelect, models, (m) => `${m.name} (#${m.id}${m.model_type ? `, ${m.model_type}` : ''})`);
      listsError.textContent = '';
    } catch (err) {
      listsError.textContent = `Could not load datasets and models: ${/** @type {Error} */ (err).message}`;
    }
  }
  async function loadWorkers() {
    await loadLists();
    try {
      const { workers } = await listAll('/workers', 'workers');
      if (stopped) return;
      /** @param {HTMLElement} list @param {string} kind */
      const fill = (list, kind) => {
        const signature = JSON.stringify(workers.filter((w) => w.kind === kind).map((w) => [w.id, w.name, w.status, w.revoked]));
        if (list.dataset.signature === signature) return;
        list.dataset.signature = signature;
        const ticked = new Set([.../** @type {NodeListOf<HTMLInputElement>} */ (list.querySelectorAll('input:checked'))]
          .map((i) => i.value));
        const mine = workers.filter((w) => w.kind === kind && !w.revoked);
        list.replaceChildren(...(mine.length ? mine.map((w) => h('label', { class: 'pick' },
          h('input', { type: 'checkbox', value: w.id, checked: ticked.has(String(w.id)), dataset: { workerName: w.name } }),
          ` ${w.name} `, h('span', { class: `status status-${w.status}` }, w.status))) : [h('p', { class: 'muted' }, 'None registered.')]));
      };
      fill(ownList, 'own');
      fill(managedList, 'managed');
    } catch {
      // The lists keep their last state; the next try may work.
    }
    if (!stopped) timer = setTimeout(loadWorkers, 3000);
  }
  loadWorkers();

  function clearErrors() {
    formError.replaceChildren();
    for (const p of form.querySelectorAll('.field-error')) p.textContent = '';
    for (const c of form.querySelectorAll('[aria-invalid]')) c.removeAttribute('aria-invalid');
  }

  /** @param {{field: string | null, message: string}[]} problems */
  function showProblems(problems) {
    const unplaced = [];
    let first = null;
    for (const { path, message: text } of problemsByField(problems, knownPaths)) {
      const slot = path && document.getElementById(errorId(path));
      if (!slot) {
        unplaced.push(text);
        continue;
      }
      slot.textContent = slot.textContent ? `${slot.textContent}; ${text}` : text;
      const control = document.getElementById(fieldId(path));
      if (control) control.setAttribute('aria-invalid', 'true');
      if (path.startsWith('distributed.') || path.startsWith('worker_selection.')) advanced.open = true;
      first ??= control ?? slot;
    }
    if (unplaced.length) formError.append(h('p', {}, 'The server refused the job:'), h('ul', {}, ...unplaced.map((t) => h('li', {}, t))));
    (first ?? formError).focus?.();
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    clearErrors();
    /** @type {Record<string, any>} */
    const body = {};
    const name = /** @type {HTMLInputElement} */ (form.querySelector(`#${fieldId('name')}`)).value.trim();
    if (name) body.name = name;
    if (datasetSelect.value) body.dataset_id = Number(datasetSelect.value);
    if (modelSelect.value) body.model_id = Number(modelSelect.value);
    for (const control of /** @type {NodeListOf<HTMLInputElement | HTMLSelectElement>} */ (form.querySelectorAll('[data-kind]'))) {
      if (/** @type {HTMLElement | null} */ (control.closest('.field'))?.hidden) continue;  // another strategy's option, another method's setting
      const value = readControl(control);
      if (value !== undefined) setPath(body, control.name, value);
    }
    // The default partition (iid, no label) is left out, so jobs that do not split a dataset get no warning about it.
    const partition = body.distributed?.partition;
    if (partition && partition.method === 'iid' && Object.keys(partition).length === 1) delete body.distributed.partition;
    const checked = (/** @type {HTMLElement} */ list) =>
      [.../** @type {NodeListOf<HTMLInputElement>} */ (list.querySelectorAll('input:checked'))].map((i) => Number(i.value));
    const own = checked(ownList);
    const managed = checked(managedList);
    if (own.length) setPath(body, 'worker_selection.worker_ids', own);
    if (managed.length) setPath(body, 'worker_selection.parsyn_worker_ids', managed);
    // "auto" with workers ticked would be refused; the ticks say which mode was meant.
    if (body.worker_selection?.mode === 'auto' && (own.length || managed.length)) {
      body.worker_selection.mode = own.length && managed.length ? 'mixed' : own.length ? 'own' : 'managed';
    }
    submit.disabled = true;
    try {
      const job = await api('POST', '/training-jobs', body);
      // The job page shows the job's warnings (job_detail.js), now and whenever it is opened again.
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'invalid_argument') {
        showProblems(err.errors.length ? err.errors : [{ field: null, message: err.message }]);
      } else {
        formError.append(h('p', {}, `Could not create the job: ${/** @type {Error} */ (err).message}`));
      }
      submit.disabled = false;
    }
  });

  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
