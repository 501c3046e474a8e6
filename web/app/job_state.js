// The job view's state and how it changes: a pure reducer (state and one action in, a new state out; the state given
// is never changed) and the read-only questions the view asks of a state. No DOM, no requests, no timers: the view
// (job_detail.js) reads the API, feeds each answer and event here as an action, asks reloadsFor() which reads an
// action calls for, and draws what the selectors below say. tests/web/job_state_test.mjs runs it in node.
//
// Truthfulness rules (web/README.md, "What the job view shows"):
//   - The coordinator runs the final evaluation as "round" total_rounds + 1: it is shown as the job's final
//     evaluation, never as a round above total_rounds.
//   - A worker card shows the worker's part in this job while the job runs; once the job has ended (or the worker has
//     no task of it), the worker's real state from /workers (idle, busy with another job, offline).
//   - Validation loss is "after round r": the loss of the global that round r committed (x = r on the chart; x = 0 is
//     the starting weights). Table and chart read the same numbers (state.validation).
import { TERMINAL } from './dom.js';

/**
 * A job as GET /training-jobs/{id} answers it (docs/openapi.yaml, Job); only the fields the view reads.
 * @typedef {object} Job
 * @property {number} id
 * @property {string} name
 * @property {string} status
 * @property {number} committed_round
 * @property {number | null} [total_rounds]
 * @property {{phase?: string} | null} [live]
 * @property {number | null} [initial_validation_loss]
 * @property {number | null} [final_validation_loss]
 * @property {number | null} [best_round]
 * @property {number | null} [best_validation_loss]
 * @property {string[]} [warnings]
 * @property {Shard[]} [shards]
 * @property {JobSpec | null} [spec]
 */
/**
 * @typedef {object} JobSpec
 * @property {{trainer?: string}} [config]
 * @property {{steps_per_round?: number, strategy?: string, partition?: Record<string, string | number>, secure_aggregation?: {enabled?: boolean},
 *   aggregation?: string, async?: {buffer_size: number, max_staleness: number}}} [distributed]
 */
/**
 * @typedef {object} Shard
 * @property {number} shard
 * @property {number | null} worker_id
 * @property {number} train_samples
 * @property {Record<string, number> | null} [label_histogram]
 */
/**
 * A worker as GET /workers lists it; only the fields the view reads.
 * @typedef {object} WorkerInfo
 * @property {number} id
 * @property {string} name
 * @property {string} status
 * @property {number | null} [current_job_id]
 * @property {string} [device]
 * @property {{name: string, describe?: {name?: string, version?: string}}[]} [trainers]
 */
/**
 * @typedef {object} PrivacyReport
 * @property {number | null} epsilon
 * @property {number} delta
 * @property {number} clipped
 * @property {number} participants
 * @property {number} clip_norm
 * @property {number} noise_stddev
 * @property {number} sampling_rate
 */
/**
 * One attempt of a round as GET /training-jobs/{id}/rounds lists it.
 * @typedef {object} Round
 * @property {number} round
 * @property {number} attempt
 * @property {string} outcome
 * @property {number[]} participants
 * @property {{worker_id: number, status: string, reason?: string, staleness?: number, trained_on_round?: number}[]} updates
 * @property {number} [started_at_ms]
 * @property {number | null} train_loss
 * @property {number | null} validation_loss
 * @property {number | null} duration_ms
 * @property {number} bytes_moved
 * @property {number | null} bytes_down
 * @property {number | null} bytes_up
 * @property {string} [failure_reason]
 * @property {PrivacyReport} [privacy]
 * @property {SecureParticipation} [secure_aggregation]
 * @property {number | null} compression_ratio
 */
/**
 * A securely aggregated attempt's phases (GET .../rounds): the worker ids of each.
 * @typedef {object} SecureParticipation
 * @property {string} phase  "unmasked" or "failed"
 * @property {number[]} participants
 * @property {number[]} advertised
 * @property {number[]} shared
 * @property {number[]} masked  the survivors, whose masked inputs were summed
 * @property {number[]} revealed
 * @property {string} [failure]
 */
/**
 * A job event's data (docs/openapi.yaml, the job's events): each type carries its own fields of these.
 * @typedef {object} JobEvent
 * @property {string} [status]
 * @property {string} [reason]
 * @property {string} [cause]
 * @property {number} round
 * @property {number} attempt
 * @property {number} [total_rounds]
 * @property {number[]} [participants]
 * @property {number} worker_id
 * @property {string} [kind]
 * @property {number} step
 * @property {number | null} [total_steps]
 * @property {number | null} [loss]
 * @property {number | null} [throughput]
 * @property {string | null} [throughput_unit]
 * @property {number | null} [utilization]
 * @property {string | null} [utilization_device]
 * @property {number | null} [device_memory_used_bytes]
 * @property {number | null} [device_memory_total_bytes]
 * @property {number} [lora_rank]
 * @property {number | null} [train_loss]
 * @property {number} global_round
 * @property {number | null} [validation_loss]
 */
/**
 * A worker's part in the job, from the events.
 * @typedef {object} WorkerView
 * @property {number} id
 * @property {string} state  idle | training | evaluating | reported | rejected | dropped | ended
 * @property {string} reason
 * @property {number} round
 * @property {string} kind  train | evaluate
 * @property {number} step
 * @property {number | null} totalSteps
 * @property {number | null} loss
 * @property {number | null} throughput
 * @property {string | null} throughputUnit
 * @property {number | null} utilization
 * @property {string | null} utilizationDevice
 * @property {number | null} memoryUsed
 * @property {number | null} memoryTotal
 * @property {number | null} loraRank  the LoRA rank of its last training task, in a job of mixed ranks
 * @property {readonly number[]} xs  the loss curve's steps (counted across rounds)
 * @property {readonly number[]} losses
 */
/**
 * Who took part in one attempt ("round-attempt") by the events, and who was dropped and why.
 * @typedef {{participants: ReadonlySet<number>, dropped: ReadonlyMap<number, string>}} AttemptRecord
 */
/**
 * @typedef {object} JobState
 * @property {number} jobId
 * @property {Job | null} job  the last GET job answer
 * @property {string} status
 * @property {string} reason
 * @property {number} round  the round in progress
 * @property {number} attempt
 * @property {number} totalRounds
 * @property {number} stepsPerRound
 * @property {ReadonlyMap<number, WorkerView>} workers  worker id -> its part in the job
 * @property {ReadonlyMap<number, string>} names  worker id -> name
 * @property {ReadonlyMap<number, number>} train  round -> aggregated training loss
 * @property {ReadonlyMap<number, number>} validation  r -> validation loss of the global after round r (0: the start)
 * @property {number} committed  the last committed round
 * @property {boolean} finalEvaluation  the job's final evaluation is running (or ran)
 * @property {ReadonlyMap<string, AttemptRecord>} attempts  "round-attempt" -> its record, from the events
 * @property {ReadonlyMap<number, WorkerInfo>} workerInfo  worker id -> its /workers entry
 * @property {readonly Round[]} rounds  the last /rounds answer
 */
/**
 * What the view feeds the reducer: the job (`first`: the page's first read of it), the workers list, the rounds
 * list, or one event of the job's stream.
 * @typedef {{type: 'job', job: Job, first?: boolean} | {type: 'workers', workers: WorkerInfo[]}
 *   | {type: 'rounds', rounds: Round[]} | {type: 'event', name: string, data: JobEvent}} JobAction
 */
/** @typedef {'job' | 'rounds' | 'artifacts' | 'workers'} Reload */

/** @param {unknown} v @returns {v is number} */
export const isNumber = (v) => typeof v === 'number' && Number.isFinite(v);

/** @param {number} jobId @returns {JobState} */
export function initialJobState(jobId) {
  return {
    jobId,
    job: null,
    status: 'queued',
    reason: '',
    round: 0,
    attempt: 1,
    totalRounds: 0,
    stepsPerRound: 0,
    workers: new Map(),
    names: new Map(),
    train: new Map(),
    validation: new Map(),
    committed: 0,
    finalEvaluation: false,
    attempts: new Map(),
    workerInfo: new Map(),
    rounds: [],
  };
}

/** @param {JobState} state @param {number} round */
export const isFinalEvaluationRound = (state, round) => state.totalRounds > 0 && round > state.totalRounds;

/** @param {number} id @returns {WorkerView} */
function newWorker(id) {
  return { id, state: 'idle', reason: '', round: 0, kind: 'train', step: 0, totalSteps: null, loss: null,
    throughput: null, throughputUnit: null, utilization: null, utilizationDevice: null, memoryUsed: null,
    memoryTotal: null, loraRank: null, xs: [], losses: [] };
}

/**
 * The reducer's working copy: a shallow copy of the state whose maps are copied the first time an action changes
 * them, so the state given stays as it was and the parts an action leaves alone are shared.
 */
class Draft {
  /** @param {JobState} state */
  constructor(state) {
    /** @type {JobState} */
    this.state = { ...state };
    /** @type {Set<string>} */
    this.copied = new Set();
  }

  /**
   * @template V
   * @param {'workers' | 'names' | 'train' | 'validation' | 'attempts' | 'workerInfo'} key
   * @returns {Map<any, V>}
   */
  map(key) {
    if (!this.copied.has(key)) {
      this.copied.add(key);
      this.state[key] = new Map(/** @type {Map<any, any>} */ (this.state[key]));
    }
    return /** @type {Map<any, V>} */ (this.state[key]);
  }

  /** @param {number} r @param {number} loss */
  setValidation(r, loss) {
    this.map('validation').set(r, loss);
  }

  /** The worker's view, changed by `change` (created idle when the job had none of it). @param {number} id @param {Partial<WorkerView>} change */
  worker(id, change) {
    /** @type {Map<number, WorkerView>} */
    const workers = this.map('workers');
    workers.set(id, { ...(workers.get(id) ?? newWorker(id)), ...change });
  }

  /** Every worker's view changed by `change`. @param {Partial<WorkerView>} change */
  everyWorker(change) {
    /** @type {Map<number, WorkerView>} */
    const workers = this.map('workers');
    for (const [id, w] of workers) workers.set(id, { ...w, ...change });
  }

  /**
   * The attempt's record with `participant` added or `dropped` set.
   * @param {number} round @param {number} attempt
   * @param {{participant?: number, dropped?: [number, string]}} change
   */
  attempt(round, attempt, { participant, dropped }) {
    /** @type {Map<string, AttemptRecord>} */
    const attempts = this.map('attempts');
    const key = `${round}-${attempt}`;
    const record = attempts.get(key) ?? { participants: new Set(), dropped: new Map() };
    attempts.set(key, {
      participants: participant === undefined ? record.participants : new Set(record.participants).add(participant),
      dropped: dropped === undefined ? record.dropped : new Map(record.dropped).set(...dropped),
    });
  }
}

/**
 * The state after `action`; `state` is left as it was.
 * @param {JobState} state @param {JobAction} action @returns {JobState}
 */
export function reduceJob(state, action) {
  const draft = new Draft(state);
  switch (action.type) {
    case 'job': applyJob(draft, action.job, action.first ?? false); break;
    case 'workers':
      for (const w of action.workers) {
        draft.map('names').set(w.id, w.name);
        draft.map('workerInfo').set(w.id, w);
      }
      break;
    case 'rounds':
      draft.state.rounds = action.rounds;
      for (const r of action.rounds) {
        if (r.outcome === 'committed' && isNumber(r.validation_loss)) draft.setValidation(r.round, r.validation_loss);
      }
      break;
    case 'event': applyEvent(draft, action.name, action.data); break;
    default: break;
  }
  return draft.state;
}

/** @param {Draft} draft @param {Job} job @param {boolean} first */
function applyJob(draft, job, first) {
  const s = draft.state;
  if (first) {
    s.status = job.status;
    s.stepsPerRound = job.spec?.distributed?.steps_per_round ?? 0;
  }
  s.job = job;
  s.totalRounds = job.total_rounds ?? s.totalRounds;
  s.committed = job.committed_round;
  if (job.live?.phase === 'final_evaluation') s.finalEvaluation = true;
  if (isNumber(job.initial_validation_loss)) draft.setValidation(0, job.initial_validation_loss);
  if (isNumber(job.final_validation_loss) && s.committed > 0) draft.setValidation(s.committed, job.final_validation_loss);
}

/** @param {Draft} draft @param {string} name @param {JobEvent} e */
function applyEvent(draft, name, e) {
  const s = draft.state;
  switch (name) {
    case 'job_status':
      s.status = e.status ?? s.status;
      s.reason = e.reason ?? '';
      // The job is over: none of its workers trains or evaluates for it any more (cards show their real state).
      if (TERMINAL.has(s.status)) draft.everyWorker({ state: 'ended', reason: '' });
      break;
    case 'round_started': roundStarted(draft, e); break;
    case 'task_assigned': {
      // The final evaluation has no round_started: its tasks (kind evaluate, round total_rounds + 1) begin it.
      if (e.kind === 'evaluate' || isFinalEvaluationRound(s, e.round)) s.finalEvaluation = true;
      draft.attempt(e.round, e.attempt, { participant: e.worker_id });
      draft.worker(e.worker_id, { state: e.kind === 'evaluate' ? 'evaluating' : 'training', kind: e.kind ?? 'train',
        round: e.round, step: 0, totalSteps: null, reason: '' });
      if (isNumber(e.lora_rank)) draft.worker(e.worker_id, { loraRank: e.lora_rank });
      break;
    }
    case 'worker_progress': workerProgress(draft, e); break;
    case 'update_accepted': draft.worker(e.worker_id, { state: 'reported' }); break;
    case 'update_rejected':
      draft.attempt(e.round, e.attempt, { dropped: [e.worker_id, `update rejected: ${e.reason}`] });
      draft.worker(e.worker_id, { state: 'rejected', reason: e.reason ?? '' });
      break;
    case 'worker_dropped':
      draft.attempt(e.round, e.attempt, { dropped: [e.worker_id, e.reason || e.cause || ''] });
      draft.worker(e.worker_id, { state: 'dropped', reason: e.reason || e.cause || '' });
      break;
    case 'round_committed':
      s.totalRounds = e.total_rounds ?? s.totalRounds;
      s.committed = e.round;
      // After the last round, the final evaluation runs until the job ends.
      if (s.totalRounds > 0 && e.round >= s.totalRounds) s.finalEvaluation = true;
      if (e.train_loss !== null && e.train_loss !== undefined) draft.map('train').set(e.round, e.train_loss);
      break;
    case 'global_evaluated':
      // global_round r: the global that round r committed (0: the starting weights).
      if (isNumber(e.validation_loss)) draft.setValidation(e.global_round, e.validation_loss);
      break;
    default: break;
  }
}

/** @param {Draft} draft @param {JobEvent} e */
function roundStarted(draft, e) {
  const s = draft.state;
  s.totalRounds = e.total_rounds ?? s.totalRounds;
  draft.everyWorker({ state: 'idle', reason: '', step: 0 });
  const evaluating = isFinalEvaluationRound(s, e.round);
  if (evaluating) {
    s.finalEvaluation = true;
  } else {
    s.round = e.round;
    s.attempt = e.attempt;
  }
  for (const id of e.participants ?? []) {
    draft.attempt(e.round, e.attempt, { participant: id });
    draft.worker(id, { state: evaluating ? 'evaluating' : 'training', kind: evaluating ? 'evaluate' : 'train',
      round: e.round });
  }
}

/** @param {Draft} draft @param {JobEvent} e */
function workerProgress(draft, e) {
  const s = draft.state;
  const before = s.workers.get(e.worker_id) ?? newWorker(e.worker_id);
  /** @type {Partial<WorkerView>} */
  const change = { round: e.round, step: e.step, totalSteps: e.total_steps ?? before.totalSteps };
  if (isNumber(e.throughput)) {
    change.throughput = e.throughput;
    change.throughputUnit = e.throughput_unit ?? null;
  }
  if (isNumber(e.utilization)) {
    change.utilization = e.utilization;
    change.utilizationDevice = e.utilization_device ?? null;
  }
  // A report without a device sample (the worker samples on its own clock) keeps the last one shown.
  if (isNumber(e.device_memory_total_bytes)) {
    change.memoryUsed = isNumber(e.device_memory_used_bytes) ? e.device_memory_used_bytes : null;
    change.memoryTotal = e.device_memory_total_bytes;
  }
  // Loss curves are of training steps; the final evaluation's progress moves the card's counter only.
  if (isNumber(e.loss) && !isFinalEvaluationRound(s, e.round)) {
    const perRound = s.stepsPerRound || change.totalSteps || 0;
    change.loss = e.loss;
    change.xs = [...before.xs, (e.round - 1) * perRound + e.step];
    change.losses = [...before.losses, e.loss];
  }
  draft.worker(e.worker_id, change);
}

/**
 * What the view re-reads because of `action`, asked of the state before it: the job when it starts running (its
 * shards exist from then) and when it ends; the rounds when an attempt starts, ends or loses a worker; the artifacts
 * when it ends; the workers list when the action names a worker the view has neither a card nor a name for.
 * @param {JobState} state @param {JobAction} action @returns {Reload[]}
 */
export function reloadsFor(state, action) {
  if (action.type !== 'event') return [];
  const { name, data: e } = action;
  /** @type {Reload[]} */
  const reloads = [];
  if (name === 'job_status' && e.status === 'running') reloads.push('job');
  if (name === 'job_status' && TERMINAL.has(e.status ?? '')) reloads.push('rounds', 'artifacts', 'job');
  if (['round_started', 'update_rejected', 'worker_dropped', 'round_committed', 'round_failed'].includes(name)) {
    reloads.push('rounds');
  }
  const named = name === 'round_started' ? e.participants ?? []
    : ['task_assigned', 'worker_progress', 'update_accepted', 'update_rejected', 'worker_dropped'].includes(name)
      ? [e.worker_id] : [];
  if (named.some((id) => !state.workers.has(id) && !state.names.has(id))) reloads.push('workers');
  return reloads;
}

// ---- selectors ----

/** @param {JobState} state @param {number} id */
export function workerName(state, id) {
  return state.names.get(id) ?? `worker #${id}`;
}

/** The job's warnings (settings it accepts but ignores), none before the job is read. @param {JobState} state */
export function jobWarnings(state) {
  return Array.isArray(state.job?.warnings) ? state.job.warnings : [];
}

/**
 * The best round: the server's best_round (GET job always carries it; null until a global was measured), which the
 * view re-reads when the job starts and ends.
 * @param {JobState} state @returns {number | null}
 */
export function bestRound(state) {
  return state.job?.best_round ?? null;
}

/**
 * Securely aggregated jobs: their rounds table has a survivors column (whose masked inputs each attempt summed).
 * @param {JobState} state
 */
export function isSecureJob(state) {
  return state.job?.spec?.distributed?.secure_aggregation?.enabled === true || state.rounds.some((r) => r.secure_aggregation);
}

/**
 * Asynchronous jobs (distributed.aggregation "async"): their rounds are versions made from a buffer of updates, each
 * trained on some earlier version; the page shows each version's updates' staleness, their histogram and each worker's
 * updates per hour.
 * @param {JobState} state
 */
export function isAsyncJob(state) {
  return state.job?.spec?.distributed?.aggregation === 'async' ||
    state.rounds.some((r) => (r.updates ?? []).some((u) => typeof u.staleness === 'number'));
}

/**
 * The accepted updates of the committed versions, counted by staleness: [staleness, count] pairs, by staleness.
 * @param {JobState} state
 * @returns {[number, number][]}
 */
export function stalenessHistogram(state) {
  /** @type {Map<number, number>} */
  const counts = new Map();
  for (const r of state.rounds) {
    if (r.outcome !== 'committed') continue;
    for (const u of r.updates ?? []) {
      if (u.status === 'accepted' && typeof u.staleness === 'number') counts.set(u.staleness, (counts.get(u.staleness) ?? 0) + 1);
    }
  }
  return [...counts.entries()].sort((a, b) => a[0] - b[0]);
}

/**
 * Each worker's accepted updates in the committed versions, and per hour over the time they span (from the first
 * version's start to the end of the last committed one; null while that is not known): by worker id.
 * @param {JobState} state
 * @returns {{worker: number, updates: number, perHour: number | null}[]}
 */
export function updatesPerHour(state) {
  /** @type {Map<number, number>} */
  const counts = new Map();
  let first = Infinity, last = -Infinity;
  for (const r of state.rounds) {
    if (typeof r.started_at_ms === 'number') first = Math.min(first, r.started_at_ms);
    if (r.outcome !== 'committed') continue;
    if (typeof r.started_at_ms === 'number' && typeof r.duration_ms === 'number') last = Math.max(last, r.started_at_ms + r.duration_ms);
    for (const u of r.updates ?? []) if (u.status === 'accepted') counts.set(u.worker_id, (counts.get(u.worker_id) ?? 0) + 1);
  }
  const hours = last > first ? (last - first) / 3_600_000 : null;
  return [...counts.entries()].sort((a, b) => a[0] - b[0])
    .map(([worker, updates]) => ({ worker, updates, perHour: hours === null ? null : updates / hours }));
}

/**
 * The versions' timeline: each committed version's number at the time it committed, in seconds since the first
 * version started; by version.
 * @param {JobState} state
 * @returns {{seconds: number[], versions: number[]}}
 */
export function versionTimeline(state) {
  const starts = state.rounds.map((r) => r.started_at_ms).filter((t) => typeof t === 'number');
  const first = starts.length ? Math.min(.../** @type {number[]} */ (starts)) : 0;
  const committed = state.rounds
    .filter((r) => r.outcome === 'committed' && typeof r.started_at_ms === 'number' && typeof r.duration_ms === 'number')
    .sort((a, b) => a.round - b.round);
  return {
    seconds: committed.map((r) => ((r.started_at_ms ?? 0) + (r.duration_ms ?? 0) - first) / 1000),
    versions: committed.map((r) => r.round),
  };
}

/**
 * dp_fedavg jobs: their rounds table has a privacy column (ε at the job's δ after each committed round).
 * @param {JobState} state
 */
export function isDpJob(state) {
  return state.job?.spec?.distributed?.strategy === 'dp_fedavg' || state.rounds.some((r) => r.privacy);
}

/**
 * One row of the round history, as the table shows it.
 * @typedef {object} RoundRow
 * @property {Round} round  the /rounds entry
 * @property {string} label  "3", "3 (attempt 2)" or "Final evaluation"
 * @property {boolean} finalEvaluation
 * @property {string} outcome  the attempt's outcome, or the final evaluation's: measured | not-measured | running
 * @property {number[]} participants  chosen at the start, given a task later, sent an update, or dropped
 * @property {[number, string][]} dropped  worker id and why
 * @property {number | null | undefined} validation  the loss after this round (committed rounds only)
 * @property {boolean} isBest
 */

/** @param {JobState} state @returns {RoundRow[]} */
export function roundRows(state) {
  const best = bestRound(state);
  const over = TERMINAL.has(state.status);
  return state.rounds.map((r) => {
    const finalEvaluation = isFinalEvaluationRound(state, r.round);
    const fromEvents = state.attempts.get(`${r.round}-${r.attempt}`);
    const participants = new Set([...(r.participants ?? []), ...(r.updates ?? []).map((u) => u.worker_id),
      ...(fromEvents?.participants ?? [])]);
    const dropped = new Map(fromEvents?.dropped ?? []);
    for (const u of r.updates ?? []) if (u.status === 'rejected') dropped.set(u.worker_id, `update rejected: ${u.reason ?? ''}`);
    for (const id of dropped.keys()) participants.add(id);
    // The final evaluation's attempt is closed when the job ends; it measured the last global if that loss is known.
    const outcome = !finalEvaluation ? r.outcome
      : over ? (state.validation.has(state.committed) ? 'measured' : 'not-measured') : 'running';
    return {
      round: r,
      label: finalEvaluation ? 'Final evaluation' : r.attempt > 1 ? `${r.round} (attempt ${r.attempt})` : `${r.round}`,
      finalEvaluation,
      outcome,
      participants: [...participants],
      dropped: [...dropped],
      validation: r.outcome === 'committed' ? state.validation.get(r.round) : null,
      isBest: !finalEvaluation && r.outcome === 'committed' && best === r.round,
    };
  });
}

/**
 * The progress line: "3 of 10", "3 of 10 (attempt 2)", "Final evaluation (after 10 of 10 rounds)", "7 of 10
 * committed" (ended), and the phase it is in.
 * @param {JobState} state @returns {{text: string, phase: 'training' | 'final_evaluation' | 'ended'}}
 */
export function roundCounter(state) {
  const total = state.totalRounds;
  const over = TERMINAL.has(state.status);
  const phase = over ? 'ended' : state.finalEvaluation ? 'final_evaluation' : 'training';
  if (state.finalEvaluation && !over) return { text: `Final evaluation (after ${state.committed ?? total} of ${total} rounds)`, phase };
  if (over) return { text: `${state.committed ?? 0} of ${total} committed`, phase };
  const round = Math.min(state.round, total || state.round);
  return { text: `${round} of ${total}${state.attempt > 1 ? ` (attempt ${state.attempt})` : ''}`, phase };
}

/**
 * The workers in each of the progress card's lists.
 * @param {JobState} state @returns {{training: WorkerView[], reported: WorkerView[], dropped: WorkerView[]}}
 */
export function workerGroups(state) {
  /** @type {{training: WorkerView[], reported: WorkerView[], dropped: WorkerView[]}} */
  const groups = { training: [], reported: [], dropped: [] };
  for (const w of state.workers.values()) {
    if (w.state === 'training' || w.state === 'evaluating') groups.training.push(w);
    else if (w.state === 'reported') groups.reported.push(w);
    else if (w.state === 'dropped' || w.state === 'rejected') groups.dropped.push(w);
  }
  return groups;
}

/**
 * The loss chart's points: every round with a training or validation loss, and each one's two losses (null: none).
 * @param {JobState} state @returns {{rounds: number[], train: (number | null)[], validation: (number | null)[]}}
 */
export function lossSeries(state) {
  const rounds = [...new Set([...state.train.keys(), ...state.validation.keys()])].sort((a, b) => a - b);
  return { rounds, train: rounds.map((r) => state.train.get(r) ?? null),
    validation: rounds.map((r) => state.validation.get(r) ?? null) };
}

/**
 * The validation losses the summary names: of the starting weights, of the result (the last committed round's
 * global) and of the best round.
 * @param {JobState} state
 * @returns {{initial: number | undefined, result: number | undefined, best: number | null, bestLoss: number | null | undefined}}
 */
export function lossSummary(state) {
  const best = bestRound(state);
  return {
    initial: state.validation.get(0),
    result: state.committed > 0 ? state.validation.get(state.committed) : undefined,
    best,
    bestLoss: best === null ? undefined : state.job?.best_validation_loss ?? state.validation.get(best),
  };
}

/**
 * What a worker's card says: its part in this job while it has one, else its real state.
 * @typedef {{badge: string, text: string, of: number | null, showProgress: boolean, link?: number}} WorkerStatus
 * @param {JobState} state @param {WorkerView} w @returns {WorkerStatus}
 */
export function workerStatus(state, w) {
  const info = state.workerInfo.get(w.id);
  const inJob = !TERMINAL.has(state.status) && w.state !== 'ended' && w.state !== 'idle';
  if (inJob) {
    const total = state.totalRounds;
    const finalEvaluation = w.kind === 'evaluate' || isFinalEvaluationRound(state, w.round);
    const of = finalEvaluation ? w.totalSteps : state.stepsPerRound || w.totalSteps;
    const steps = of ? `step ${w.step} of ${of}` : `step ${w.step}`;
    const where = finalEvaluation ? 'final evaluation' : `round ${w.round} of ${total}`;
    const text = w.state === 'training' || w.state === 'evaluating' ? `${finalEvaluation ? 'final evaluation' : 'training'} — ${steps}${finalEvaluation ? '' : ` in ${where}`}`
      : w.state === 'reported' ? `reported its update for ${where}`
        : `${w.state} in ${where}${w.reason ? `: ${w.reason}` : ''}`;
    return { badge: w.state === 'evaluating' ? 'evaluating' : w.state, text, of, showProgress: w.state === 'training' || w.state === 'evaluating' };
  }
  if (!info) return { badge: 'unknown', text: 'state not known yet', of: 0, showProgress: false };
  if (info.status === 'busy' && info.current_job_id && info.current_job_id !== state.jobId) {
    return { badge: 'busy', text: `busy with training job #${info.current_job_id}`, link: info.current_job_id, of: 0, showProgress: false };
  }
  if (info.status === 'online' || info.status === 'busy') {
    return { badge: 'idle', text: 'online, idle (no task of this job)', of: 0, showProgress: false };
  }
  return { badge: info.status, text: info.status === 'offline' ? 'offline' : info.status, of: 0, showProgress: false };
}

/**
 * The worker's trainer of the job's name, as its hello described it: "builtin (pytorch-tabular 0.1)"; "—" when the
 * job names none or the worker does not offer it.
 * @param {JobState} state @param {number} workerId
 */
export function trainerOf(state, workerId) {
  const name = state.job?.spec?.config?.trainer;
  const offered = state.workerInfo.get(workerId)?.trainers ?? [];
  const t = offered.find((x) => x.name === name);
  if (!name || !t) return '—';
  const described = [t.describe?.name, t.describe?.version].filter(Boolean).join(' ');
  return described ? `${name} (${described})` : name;
}
