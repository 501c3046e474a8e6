// Unit test of the job view's reducer (web/app/job_state.js), node only: sequences of job answers and events as the
// coordinator sends them (docs/openapi.yaml, the job's events) and what the view then shows: the round history's
// rows, the progress line, the worker lists and cards, the loss chart's points, the warnings, and what is re-read.
import assert from 'node:assert/strict';
import test from 'node:test';

import {
  initialJobState, reduceJob, reloadsFor, roundRows, roundCounter, workerGroups, workerStatus, lossSeries, lossSummary,
  jobWarnings, isAsyncJob, isDpJob, stalenessHistogram, trainerOf, updatesPerHour, versionTimeline, workerName,
} from '../../web/app/job_state.js';

const JOB_ID = 7;

// A distributed job of 2 rounds as GET job answers it while it is queued.
function job(fields = {}) {
  return {
    id: JOB_ID, name: 'digits', status: 'queued', committed_round: 0, total_rounds: 2,
    initial_validation_loss: null, final_validation_loss: null, best_round: null, best_validation_loss: null,
    warnings: [], spec: { config: { trainer: 'builtin' }, distributed: { steps_per_round: 10, strategy: 'federated_averaging' } },
    ...fields,
  };
}

const event = (name, data) => ({ type: 'event', name, data: { job_id: JOB_ID, ...data } });

function run(actions, state = reduceJob(initialJobState(JOB_ID), { type: 'job', job: job(), first: true })) {
  return actions.reduce(reduceJob, state);
}

// Round 1 with workers 1 and 2 (worker 2 dropped), round 2 with worker 1, then the final evaluation and success.
const WHOLE_JOB = [
  { type: 'workers', workers: [{ id: 1, name: 'alpha', status: 'online' }, { id: 2, name: 'beta', status: 'online' }] },
  event('job_status', { status: 'running' }),
  event('round_started', { round: 1, attempt: 1, total_rounds: 2, participants: [1, 2] }),
  event('task_assigned', { round: 1, attempt: 1, worker_id: 1, kind: 'train' }),
  event('task_assigned', { round: 1, attempt: 1, worker_id: 2, kind: 'train' }),
  event('worker_progress', { round: 1, attempt: 1, worker_id: 1, step: 5, total_steps: 10, loss: 2.0 }),
  event('worker_progress', { round: 1, attempt: 1, worker_id: 1, step: 10, total_steps: 10, loss: 1.5 }),
  event('update_accepted', { round: 1, attempt: 1, worker_id: 1 }),
  event('worker_dropped', { round: 1, attempt: 1, worker_id: 2, cause: 'straggler', reason: 'missed the deadline' }),
  event('global_evaluated', { global_round: 0, validation_loss: 2.5 }),
  event('round_committed', { round: 1, attempt: 1, total_rounds: 2, train_loss: 1.5 }),
  event('global_evaluated', { global_round: 1, validation_loss: 1.25 }),
  event('round_started', { round: 2, attempt: 1, total_rounds: 2, participants: [1] }),
  event('task_assigned', { round: 2, attempt: 1, worker_id: 1, kind: 'train' }),
  event('worker_progress', { round: 2, attempt: 1, worker_id: 1, step: 10, total_steps: 10, loss: 1.0 }),
  event('update_accepted', { round: 2, attempt: 1, worker_id: 1 }),
  event('round_committed', { round: 2, attempt: 1, total_rounds: 2, train_loss: 1.0 }),
  event('task_assigned', { round: 3, attempt: 1, worker_id: 1, kind: 'evaluate' }),
  event('worker_progress', { round: 3, attempt: 1, worker_id: 1, step: 4, total_steps: 8, loss: 0.9 }),
  event('global_evaluated', { global_round: 2, validation_loss: 1.5 }),
  event('job_status', { status: 'succeeded' }),
];

// GET rounds once the job ended: the attempts as stored, and the final evaluation's attempt (round 3).
const ROUNDS = [
  { round: 1, attempt: 1, outcome: 'committed', participants: [1, 2], train_loss: 1.5, validation_loss: 1.25,
    duration_ms: 1200, bytes_moved: 100, bytes_down: 60, bytes_up: 40, compression_ratio: null,
    updates: [{ worker_id: 1, status: 'accepted' }] },
  { round: 2, attempt: 1, outcome: 'committed', participants: [1], train_loss: 1.0, validation_loss: 1.5,
    duration_ms: 900, bytes_moved: 50, bytes_down: null, bytes_up: null, compression_ratio: 1,
    updates: [{ worker_id: 1, status: 'accepted' }] },
  { round: 3, attempt: 1, outcome: 'running', participants: [1], train_loss: null, validation_loss: null,
    duration_ms: null, bytes_moved: 0, bytes_down: 0, bytes_up: 0, compression_ratio: null,
    updates: [] },
];

// The fields of the rows the table shows, without the /rounds entry each carries.
const shown = (rows) => rows.map(({ round, ...row }) => ({ round: round.round, attempt: round.attempt, ...row }));

test('a whole job: the round history lists each attempt, who took part, who was dropped and why', () => {
  const ended = run([...WHOLE_JOB, { type: 'job', job: job({ status: 'succeeded', committed_round: 2,
    initial_validation_loss: 2.5, final_validation_loss: 1.5, best_round: 1, best_validation_loss: 1.25 }) },
  { type: 'rounds', rounds: ROUNDS }]);
  assert.deepEqual(shown(roundRows(ended)), [
    { round: 1, attempt: 1, label: '1', finalEvaluation: false, outcome: 'committed', participants: [1, 2],
      dropped: [[2, 'missed the deadline']], validation: 1.25, isBest: true },
    { round: 2, attempt: 1, label: '2', finalEvaluation: false, outcome: 'committed', participants: [1], dropped: [],
      validation: 1.5, isBest: false },
    // Round total_rounds + 1 is the final evaluation, never a third round; it measured the result's loss.
    { round: 3, attempt: 1, label: 'Final evaluation', finalEvaluation: true, outcome: 'measured', participants: [1],
      dropped: [], validation: null, isBest: false },
  ]);
  assert.equal(ended.status, 'succeeded');
  assert.deepEqual(roundCounter(ended), { text: '2 of 2 committed', phase: 'ended' });
  assert.deepEqual(lossSummary(ended), { initial: 2.5, result: 1.5, best: 1, bestLoss: 1.25 });
  assert.deepEqual(lossSeries(ended), { rounds: [0, 1, 2], train: [null, 1.5, 1.0], validation: [2.5, 1.25, 1.5] });
  // Once the job has ended no worker is in it: every card shows the worker's real state, nobody is listed as training.
  assert.deepEqual(workerGroups(ended), { training: [], reported: [], dropped: [] });
  assert.deepEqual(workerStatus(ended, ended.workers.get(1)),
    { badge: 'idle', text: 'online, idle (no task of this job)', of: 0, showProgress: false });
});

test('the progress line and the worker lists follow the events', () => {
  const steps = WHOLE_JOB.map((_, i) => run(WHOLE_JOB.slice(0, i + 1)));
  const at = (name, matches = () => true) => steps[WHOLE_JOB.findIndex((a) => a.name === name && matches(a.data))];

  const started = at('round_started');
  assert.deepEqual(roundCounter(started), { text: '1 of 2', phase: 'training' });
  assert.deepEqual(workerGroups(started).training.map((w) => w.id), [1, 2]);
  assert.equal(workerStatus(started, started.workers.get(1)).text, 'training — step 0 of 10 in round 1 of 2');

  const dropped = at('worker_dropped');
  assert.deepEqual(workerGroups(dropped).reported.map((w) => w.id), [1]);
  assert.deepEqual(workerGroups(dropped).dropped.map((w) => [w.id, w.reason]), [[2, 'missed the deadline']]);
  assert.equal(workerStatus(dropped, dropped.workers.get(2)).text, 'dropped in round 1 of 2: missed the deadline');

  // A new round puts every worker back to idle, then its participants to training.
  const second = at('round_started', (e) => e.round === 2);
  assert.deepEqual(roundCounter(second), { text: '2 of 2', phase: 'training' });
  assert.equal(second.workers.get(2).state, 'idle');
  assert.equal(second.workers.get(1).step, 0);

  // After the last round's commit the final evaluation runs; its tasks are round total_rounds + 1.
  const lastCommit = at('round_committed', (e) => e.round === 2);
  assert.deepEqual(roundCounter(lastCommit), { text: 'Final evaluation (after 2 of 2 rounds)', phase: 'final_evaluation' });
  const evaluating = at('worker_progress', (e) => e.round === 3);
  assert.deepEqual(workerStatus(evaluating, evaluating.workers.get(1)),
    { badge: 'evaluating', text: 'final evaluation — step 4 of 8', of: 8, showProgress: true });
  // The final evaluation's progress moves the counter only: the loss curve keeps the training steps (x across rounds).
  assert.deepEqual(evaluating.workers.get(1).xs, [5, 10, 20]);
  assert.deepEqual(evaluating.workers.get(1).losses, [2.0, 1.5, 1.0]);
  assert.equal(evaluating.workers.get(1).loss, 1.0);
});

test('the reducer leaves the state it is given as it was', () => {
  const before = run(WHOLE_JOB.slice(0, 6));
  const snapshot = structuredClone(before);
  const after = run(WHOLE_JOB.slice(6), before);
  assert.deepEqual(before, snapshot);
  assert.notEqual(after, before);
  assert.equal(before.workers.get(2).state, 'training');
  assert.equal(after.workers.get(2).state, 'ended');
});

test('an event replayed after a reconnect changes nothing more', () => {
  const once = run(WHOLE_JOB.slice(0, 12));
  const twice = run(WHOLE_JOB.slice(3, 12), once);
  assert.deepEqual(twice.attempts, once.attempts);
  assert.deepEqual(twice.train, once.train);
  assert.deepEqual(twice.validation, once.validation);
  assert.equal(twice.committed, once.committed);
  const rows = (s) => shown(roundRows(reduceJob(s, { type: 'rounds', rounds: ROUNDS.slice(0, 1) })));
  assert.deepEqual(rows(twice), rows(once));
});

test('events out of order are taken as they come', () => {
  // A rejected update before its task_assigned (events of two sources): listed as dropped, and as a participant.
  const rejectedFirst = run([
    event('round_started', { round: 1, attempt: 2, total_rounds: 2, participants: [] }),
    event('update_rejected', { round: 1, attempt: 2, worker_id: 4, reason: 'sha256 mismatch' }),
    event('task_assigned', { round: 1, attempt: 2, worker_id: 4, kind: 'train' }),
    { type: 'rounds', rounds: [{ ...ROUNDS[0], attempt: 2, outcome: 'failed', failure_reason: 'too few updates',
      participants: [], updates: [] }] },
  ]);
  assert.deepEqual(shown(roundRows(rejectedFirst)), [
    { round: 1, attempt: 2, label: '1 (attempt 2)', finalEvaluation: false, outcome: 'failed', participants: [4],
      dropped: [[4, 'update rejected: sha256 mismatch']], validation: null, isBest: false },
  ]);
  // The later task_assigned wins the card: the worker trains again.
  assert.equal(rejectedFirst.workers.get(4).state, 'training');
  assert.deepEqual(roundCounter(rejectedFirst), { text: '1 of 2 (attempt 2)', phase: 'training' });

  // A late commit of an older round moves the committed round back to it (as the stream's order says).
  const late = run([
    event('round_committed', { round: 2, attempt: 1, total_rounds: 3, train_loss: 0.5 }),
    event('round_committed', { round: 1, attempt: 1, total_rounds: 3, train_loss: 0.7 }),
  ]);
  assert.equal(late.committed, 1);
  assert.deepEqual([...late.train], [[2, 0.5], [1, 0.7]]);
  assert.deepEqual(lossSeries(late).rounds, [1, 2]);
});

test('a job that failed before its final evaluation measured nothing', () => {
  const failed = run([
    event('round_started', { round: 1, attempt: 1, total_rounds: 1, participants: [1] }),
    event('round_committed', { round: 1, attempt: 1, total_rounds: 1, train_loss: 1 }),
    event('task_assigned', { round: 2, attempt: 1, worker_id: 1, kind: 'evaluate' }),
    event('job_status', { status: 'failed', reason: 'every worker went offline' }),
    { type: 'rounds', rounds: [{ ...ROUNDS[2], round: 2 }] },
  ]);
  assert.equal(failed.reason, 'every worker went offline');
  assert.deepEqual(roundRows(failed).map((r) => [r.label, r.outcome]), [['Final evaluation', 'not-measured']]);
  // While it still ran, the same row said so.
  const running = reduceJob(run(WHOLE_JOB.slice(0, 19)), { type: 'rounds', rounds: ROUNDS });
  assert.equal(roundRows(running)[2].outcome, 'running');
});

test('worker progress keeps the last device sample and names the units', () => {
  const s = run([
    event('worker_progress', { round: 1, attempt: 1, worker_id: 3, step: 1, throughput: 120, throughput_unit: 'tokens/s',
      utilization: 0.5, utilization_device: 'gpu', device_memory_used_bytes: 2 ** 30, device_memory_total_bytes: 2 ** 32 }),
    event('worker_progress', { round: 1, attempt: 1, worker_id: 3, step: 2 }),
  ]);
  const w = s.workers.get(3);
  assert.deepEqual([w.step, w.throughput, w.throughputUnit, w.utilization, w.utilizationDevice, w.memoryUsed, w.memoryTotal],
    [2, 120, 'tokens/s', 0.5, 'gpu', 2 ** 30, 2 ** 32]);
});

test('the job answer: warnings, trainer, totals and losses', () => {
  const s = run([
    { type: 'workers', workers: [{ id: 1, name: 'alpha', status: 'busy', current_job_id: 9,
      trainers: [{ name: 'builtin', describe: { name: 'pytorch-tabular', version: '0.1' } }] }] },
    { type: 'job', job: job({ status: 'running', total_rounds: 5, committed_round: 3, live: { phase: 'final_evaluation' },
      warnings: ['config.epochs is ignored: distributed.steps_per_round 500 sets the round length'],
      initial_validation_loss: 3, final_validation_loss: 2, best_round: 2, best_validation_loss: 1.9 }) },
  ]);
  assert.deepEqual(jobWarnings(s), ['config.epochs is ignored: distributed.steps_per_round 500 sets the round length']);
  assert.deepEqual(jobWarnings(initialJobState(JOB_ID)), []);
  // A later read of the job does not change the status the events set; only the first read does.
  assert.equal(s.status, 'queued');
  assert.equal(s.totalRounds, 5);
  assert.equal(s.stepsPerRound, 10);
  assert.equal(s.finalEvaluation, true);
  assert.deepEqual([...s.validation], [[0, 3], [3, 2]]);
  assert.deepEqual(lossSummary(s), { initial: 3, result: 2, best: 2, bestLoss: 1.9 });
  // The best round is the server's: none while it names none, whatever losses the events measured.
  const measured = reduceJob(reduceJob(s, { type: 'job', job: job({ committed_round: 2, best_round: null }) }),
    event('global_evaluated', { global_round: 1, validation_loss: 0.5 }));
  assert.equal(lossSummary(measured).best, null);
  assert.equal(trainerOf(s, 1), 'builtin (pytorch-tabular 0.1)');
  assert.equal(trainerOf(s, 2), '—');
  assert.equal(workerName(s, 1), 'alpha');
  assert.equal(workerName(s, 2), 'worker #2');
  // A worker with no task of this job, busy with another one, says which.
  const card = reduceJob(s, event('round_started', { round: 1, attempt: 1, participants: [1] }));
  const idle = reduceJob(card, event('round_started', { round: 2, attempt: 1, participants: [] }));
  assert.deepEqual(workerStatus(idle, idle.workers.get(1)),
    { badge: 'busy', text: 'busy with training job #9', link: 9, of: 0, showProgress: false });
});

test('dp_fedavg jobs have the privacy column', () => {
  const plain = run([]);
  assert.equal(isDpJob(plain), false);
  const dp = run([], reduceJob(initialJobState(JOB_ID), { type: 'job', first: true,
    job: job({ spec: { distributed: { strategy: 'dp_fedavg' } } }) }));
  assert.equal(isDpJob(dp), true);
  const reported = reduceJob(plain, { type: 'rounds', rounds: [{ ...ROUNDS[0], privacy: { epsilon: 1.2 } }] });
  assert.equal(isDpJob(reported), true);
});

test('asynchronous jobs: the staleness of the versions\' accepted updates and each worker\'s updates per hour', () => {
  assert.equal(isAsyncJob(run([])), false);
  const spec = reduceJob(initialJobState(JOB_ID), { type: 'job', first: true,
    job: job({ spec: { distributed: { aggregation: 'async', async: { buffer_size: 2, max_staleness: 5 } } } }) });
  assert.equal(isAsyncJob(spec), true);
  const update = (worker_id, staleness, status = 'accepted') =>
    ({ worker_id, status, staleness, trained_on_round: 0 });
  // Two versions of half an hour each; a failed attempt's and a rejected update do not count.
  const versions = reduceJob(run([]), { type: 'rounds', rounds: [
    { ...ROUNDS[0], started_at_ms: 0, duration_ms: 1_800_000, updates: [update(1, 0), update(2, 0)] },
    { ...ROUNDS[1], attempt: 1, outcome: 'failed', started_at_ms: 1_800_000, duration_ms: 10, updates: [update(2, 3)] },
    { ...ROUNDS[1], attempt: 2, started_at_ms: 1_800_000, duration_ms: 1_800_000,
      updates: [update(1, 0), update(2, 1), update(3, 1, 'rejected')] },
  ] });
  assert.equal(isAsyncJob(versions), true);
  assert.deepEqual(stalenessHistogram(versions), [[0, 3], [1, 1]]);
  assert.deepEqual(updatesPerHour(versions), [{ worker: 1, updates: 2, perHour: 2 }, { worker: 2, updates: 2, perHour: 2 }]);
  // The timeline: each committed version at its commit, in seconds since the first version started.
  assert.deepEqual(versionTimeline(versions), { seconds: [1800, 3600], versions: [1, 2] });
  // Before any version committed the rates are not known.
  const running = reduceJob(run([]), { type: 'rounds', rounds: [{ ...ROUNDS[2], started_at_ms: 5 }] });
  assert.deepEqual(updatesPerHour(running), []);
});

test('what the view re-reads after each action', () => {
  const s = run(WHOLE_JOB.slice(0, 1));  // workers 1 and 2 known by name
  assert.deepEqual(reloadsFor(s, event('job_status', { status: 'running' })), ['job']);
  assert.deepEqual(reloadsFor(s, event('job_status', { status: 'cancelled' })), ['rounds', 'artifacts', 'job']);
  assert.deepEqual(reloadsFor(s, event('round_started', { round: 1, attempt: 1, participants: [1, 2] })), ['rounds']);
  assert.deepEqual(reloadsFor(s, event('round_started', { round: 1, attempt: 1, participants: [1, 5] })),
    ['rounds', 'workers']);
  assert.deepEqual(reloadsFor(s, event('worker_progress', { round: 1, attempt: 1, worker_id: 6, step: 1 })), ['workers']);
  assert.deepEqual(reloadsFor(s, event('update_accepted', { round: 1, attempt: 1, worker_id: 1 })), []);
  assert.deepEqual(reloadsFor(s, event('round_failed', { round: 1, attempt: 1 })), ['rounds']);
  assert.deepEqual(reloadsFor(s, { type: 'rounds', rounds: [] }), []);
});

test('a job of mixed LoRA ranks: each worker card keeps the rank of its last training task', () => {
  const state = run([
    event('round_started', { round: 1, attempt: 1, total_rounds: 2, participants: [1, 2] }),
    event('task_assigned', { round: 1, attempt: 1, worker_id: 1, kind: 'train', lora_rank: 16 }),
    event('task_assigned', { round: 1, attempt: 1, worker_id: 2, kind: 'train', lora_rank: 4 }),
    // The final evaluation reads the global at its own rank: no rank in its event, the card keeps the last one.
    event('task_assigned', { round: 3, attempt: 1, worker_id: 2, kind: 'evaluate' }),
  ]);
  assert.equal(state.workers.get(1).loraRank, 16);
  assert.equal(state.workers.get(2).loraRank, 4);
  // A job of one rank says none: the card shows no rank.
  assert.equal(run([event('task_assigned', { round: 1, attempt: 1, worker_id: 3, kind: 'train' })]).workers.get(3).loraRank, null);
});
