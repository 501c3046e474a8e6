// RoundEngine: one job's round state machine (docs/architecture.md §4), as a pure, deterministic object. It performs no
// I/O: the coordinator feeds it events (workers coming and going, results, validation verdicts, aggregation outcomes,
// timer ticks, stop/cancel) and carries out the actions it returns, in order (persist, send tasks, aggregate, ...).
// Time comes only from the injected Clock, so every timeout is testable with FakeClock.
//
// Per round: distribute -> train -> upload -> aggregate -> commit.
//   - An attempt of round r starts (StartRound) and waits for workers: participants are the strategy's choice among
//     the eligible workers that are online, idle and hold a shard, at most max_workers. Tasks go out when every
//     such worker that is online is idle (or max_workers are), or, while some are still busy (e.g. reporting the
//     previous round) or a listed worker (worker_selection) has not been heard from yet (it says hello a moment
//     after the job was created, or after a coordinator restart), once min_workers are idle and join_window has
//     passed since they were: min_workers is about how many must complete, so a worker is never left out only
//     because it reported last or came online late. With fewer than
//     min_workers available it keeps waiting, until aggregation_timeout after the attempt started, when it fails.
//   - Each participant gets an AssignTask (its shard, its seed TaskSeed(job seed, r, shard)). The attempt's deadline
//     is aggregation_timeout after the attempt started (StartRound), whenever its tasks went out.
//   - Jobs over the workers' own data (workers_hold_data): only workers that have a data file (worker_has_data) are
//     eligible, and a reported sample count must be within max_samples_per_worker; shards are then mere slots (for
//     seeds and the order of updates) with no rows behind them.
//   - A result (ResultUploaded) is checked (round, attempt, sample count within the shard, finite losses) and then
//     handed to the caller to validate and accumulate (ValidateUpdate -> UpdateValidated). A rejected update drops
//     that worker from the round with the reason recorded; the job goes on.
//   - A participant that disconnects or abandons its task before uploading leaves the round's expected set.
//   - When no participant is still training or being validated: with >= min_workers accepted updates the round is
//     aggregated at once (AggregateRound), otherwise it fails (it can no longer reach min_workers).
//   - At the deadline, participants still training are dropped as stragglers; updates already uploaded finish
//     validation, then the rule above applies.
//   - After the caller reports AggregationFinished(OK) (the new global is a durable blob), the round commits
//     (GlobalEvaluated for the previous global, CommitRound) and round r+1 starts. A failed round (FailRound) keeps
//     the previous global and is retried as a new attempt after a backoff (RetryBackoff: retry_backoff doubling
//     with each consecutive failure, at most aggregation_timeout), so a transient outage does not use up
//     fault_tolerance in milliseconds; after fault_tolerance consecutive failed rounds the job fails (JobFailed,
//     with the reason).
//   - After the last round commits, an evaluation-only "round" num_rounds+1 (TaskKind::kEvaluate, best effort within
//     aggregation_timeout) measures the final global's validation loss; then JobSucceeded. Its tasks go out by the
//     rule of a round (every online worker of the job idle, or the join window passed) but one worker suffices, so
//     the final loss is measured on the same validation slices as the globals before it whenever those workers are
//     there.
//   - A worker that returns (WorkerAvailable after a disconnect) keeps its shard and takes part from the next round
//     that starts, with the latest committed global.
//   - Results for another round or attempt, or from a dropped worker, are refused (FailedPrecondition); a repeated
//     result for the same task is accepted and changes nothing (idempotent).
//   - Stop: finish with the latest committed global (a round being aggregated is committed first). Cancel: at once.
//
// Worker presence: a worker is assigned a task only while idle, i.e. after WorkerAvailable (it is polling for a
// task) and before its next task or WorkerDisconnected. A worker that says it is available while it still has an
// unreported task of this job has abandoned that task.
//
// Asynchronous rounds (config.async, distributed.aggregation "async"; FedBuff): round r is version r, built from a
// buffer instead of a cohort.
//   - Tasks go out whenever a worker that can take part is idle and fewer than max_concurrency tasks are in
//     training; each trains the latest committed global (round r's task trains global r - 1). min_workers, the join
//     window and client sampling do not apply. A worker gives at most one update to a version: one whose update is
//     accepted into the version in progress gets its next task once that version commits.
//   - A task keeps its (round, attempt) when versions commit meanwhile; its result is taken while its staleness,
//     the versions committed since its global (version in progress - its round), is at most max_staleness, and
//     refused (FailedPrecondition naming the versions) otherwise: the worker takes new work.
//   - ValidateUpdate names the version in progress (round, attempt), the update's global (trained_on_round) and its
//     staleness; once buffer_size updates are accepted, AggregateRound lists them in the order they were accepted.
//   - Each task has its own deadline, aggregation_timeout after it went out: then it is dropped as a straggler.
//   - A commit keeps the tasks in training; the next version starts at once (StartRound). After the last version,
//     tasks still in training are dropped (kJobEnded) and the final evaluation runs as in a synchronous job.
//   - A failed aggregation (FailRound) discards the buffer and the version starts again as a new attempt at once;
//     tasks in training go on. A version's validation loss (GlobalEvaluated) is that of the updates that trained on it
//     and were accepted into the next version.
//
// Restart: the caller persists checkpoint() after every event whose actions it carries out; Restore() from that
// checkpoint resumes at round last_committed_round + 1 with a new attempt number, so no round number is skipped or
// repeated and results of attempts started before the restart are refused as late.
//
// The caller's part, per action: StartRound -> Begin(round, latest committed global) of the round's aggregation
// (strategy::RoundAggregation, in the caller's Aggregator); AssignTask -> send the task (signed URLs of that global and
// of the worker's shard, the seed); ValidateUpdate -> check the upload (size, sha256), accept it there (update,
// sample_count), answer UpdateValidated; AggregateRound -> Finish() there, store
// the new global durably, answer AggregationFinished; CommitRound / FailRound / GlobalEvaluated / DropWorker / Job*
// -> record them (and, for DropWorker with kStraggler or kJobEnded, cancel the worker's task). Persist checkpoint()
// together with the records, before anything leaves the process.
//
// Threads: owned by the job on the coordinator's event loop; not thread-safe. The Strategy and Clock passed in must
// outlive the engine; only the strategy's const ConfigureRound is called.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "coordinator/job_spec.h"
#include "strategy/strategy.h"

namespace parsyn::coordinator {

using WorkerId = int64_t;

struct RoundEngineConfig {
  uint64_t job_seed = 0;
  int num_rounds = 1;
  int min_workers = 1;
  int max_workers = 1;
  Clock::Duration aggregation_timeout = std::chrono::minutes(10);
  int fault_tolerance = 1;  // consecutive failed rounds that fail the job; >= 1
  // Workers allowed to take part; empty: any worker (worker_selection.mode auto).
  std::vector<WorkerId> eligible_workers;
  // Data shards of the job. When it equals eligible_workers.size(), shard i belongs to eligible_workers[i];
  // otherwise shards are slots given to workers in the order they first become available, kept for the job.
  int num_shards = 1;
  // Training rows of each shard: a reported sample count must be within it. Empty: only positivity is checked.
  std::vector<int64_t> shard_train_rows;
  // The job trains on the workers' own files (data.source "workers"): a worker takes part only while
  // worker_has_data(worker) holds, asked when it becomes available (WorkerAvailable, Start's and Restore's idle
  // workers; the caller answers from the worker's hello), and a reported sample count — its weight in the average —
  // must be at most max_samples_per_worker.
  bool workers_hold_data = false;
  std::function<bool(WorkerId)> worker_has_data;
  // Whether the worker offers the job's trainer (config.trainer) for the job's model kind (its hello's trainers,
  // docs/trainer-contract.md): a worker takes part only while it holds, asked as worker_has_data is. nullptr: all do.
  std::function<bool(WorkerId)> worker_offers_trainer;
  int64_t max_samples_per_worker = 0;  // 0: no bound beyond shard_train_rows
  // How long an attempt waits, once min_workers are idle, for selected workers that are online but still busy, or
  // listed ones not heard from yet, before it starts without them. 0: start as soon as min_workers are idle.
  Clock::Duration join_window{0};
  // The pause before a failed round's next attempt: retry_backoff * 2^(k-1) after the k-th consecutive failure,
  // at most aggregation_timeout. 0: retry at once.
  Clock::Duration retry_backoff{0};
  // distributed.early_stopping; absent: every round runs.
  std::optional<EarlyStopping> early_stopping;
  // distributed.strategy_options' sample_fraction / sample_count: passed to the strategy's ConfigureRound for
  // training rounds (the final evaluation takes any one worker).
  strategy::Sampling sampling;
  // distributed.aggregation "async" (see "Asynchronous rounds" above); absent: synchronous rounds.
  struct Async {
    int buffer_size = 1;      // accepted updates that make a version
    int max_concurrency = 1;  // tasks in training at once
    int max_staleness = 0;    // versions an update may lag; older ones are refused
  };
  std::optional<Async> async;
};

// The job defaults for the two waits above (docs/training.md): a few seconds for workers still reporting
// (distributed.join_window), and 5 s, 10 s, 20 s, ... between attempts of a failing round.
inline constexpr std::chrono::seconds kDefaultJoinWindow{5};
inline constexpr std::chrono::seconds kDefaultRetryBackoff{5};

// The pause after the k-th consecutive failed attempt (k >= 1) under `config`.
Clock::Duration RetryBackoff(const RoundEngineConfig& config, int consecutive_failures);

// The engine configuration of a validated job: distributed jobs get one shard per listed worker (or max_workers
// slots in auto mode); an ordinary job one shard for whichever of its workers comes first.
RoundEngineConfig EngineConfigFor(const JobSpec& spec);

// What survives a restart; persisted by the caller (see Restart above).
struct EngineCheckpoint {
  int last_committed_round = 0;    // 0: none yet (the global is the initial weights)
  int attempts_of_next_round = 0;  // attempts of round last_committed_round + 1 started so far
  int consecutive_failed_rounds = 0;
  std::map<WorkerId, int> shards;  // worker -> shard bound so far
  // Early stopping's state (kept whether or not it is on), from the globals evaluated so far in order; the caller
  // rebuilds it after a restart by replaying the stored losses through RecordEvaluation.
  std::optional<double> best_validation_loss;  // the lowest so far
  int best_global_round = 0;                   // whose global had it (0: the starting weights)
  int evaluations_without_improvement = 0;     // since the last improvement by more than min_delta

  friend bool operator==(const EngineCheckpoint&, const EngineCheckpoint&) = default;
};

// Counts one evaluated global into `checkpoint`'s early-stopping state (see the rule in the header comment).
void RecordEvaluation(EngineCheckpoint& checkpoint, const RoundEngineConfig& config, int global_round,
                      double validation_loss);
// Whether early stopping is on and its patience is used up: the job ends after its last committed round.
bool EarlyStopReached(const EngineCheckpoint& checkpoint, const RoundEngineConfig& config);

enum class TaskKind { kTrain, kEvaluate };

// Why a worker left a round. kStraggler and kJobEnded: the worker may still be running the task; tell it to abandon
// it. kRejected: its result or update did not pass the checks (the reason says which).
enum class DropCause { kDisconnected, kAbandoned, kStraggler, kRejected, kJobEnded, kTaskFailed };
// "disconnected", "abandoned", "straggler", "rejected", "job_ended", "task_failed"
std::string_view DropCauseName(DropCause cause);

// An attempt of a round begins (waiting for workers). attempt > 1: a retry of a failed attempt.
struct StartRound {
  int round = 0;
  int attempt = 0;
};
// Send this task to the worker: train (or, for kEvaluate, only evaluate) the latest committed global on its shard.
// (round, attempt) name the task; its result names them back.
struct AssignTask {
  WorkerId worker = 0;
  int round = 0;
  int attempt = 0;
  int shard = 0;
  uint64_t seed = 0;
  TaskKind kind = TaskKind::kTrain;
};
// The worker's uploaded update needs validating (layout, finiteness, size, sha256) and accumulating into the
// round's strategy; answer with UpdateValidated.
struct ValidateUpdate {
  WorkerId worker = 0;
  int round = 0;  // the round (version) whose aggregation takes the update: the answer names it
  int attempt = 0;
  int shard = 0;
  int64_t sample_count = 0;
  // The global the update trained from (round - 1 in a synchronous job), and how many versions were committed since
  // (0 in a synchronous job), and the task that made it.
  int trained_on_round = 0;
  int staleness = 0;
  int task_round = 0;
  int task_attempt = 0;
};
// The worker left the round; `reason` is for people (stored, shown).
struct DropWorker {
  WorkerId worker = 0;
  int round = 0;  // the round (version) in progress
  int attempt = 0;
  DropCause cause = DropCause::kDisconnected;
  std::string reason;
  int task_round = 0;  // the worker's task (differs from round, attempt only in an asynchronous job)
  int task_attempt = 0;
};
struct AcceptedUpdate {
  WorkerId worker = 0;
  int shard = 0;
  int64_t sample_count = 0;
  double train_loss = 0;
  int trained_on_round = 0;  // the global it trained from
  int staleness = 0;         // versions committed between that global and its acceptance
};
// Finish the round's strategy (exactly these updates were accepted; sorted by shard, or in the order they were
// accepted in an asynchronous job), make the new global a durable blob, then answer with AggregationFinished.
struct AggregateRound {
  int round = 0;
  int attempt = 0;
  std::vector<AcceptedUpdate> updates;
  double train_loss = 0;  // sample-weighted mean of the workers' mean training losses
};
// The sample-weighted validation loss of the global committed at `global_round` (0: the initial weights), measured
// by workers on their validation slices before training on it.
struct GlobalEvaluated {
  int global_round = 0;
  double validation_loss = 0;
  int64_t validation_samples = 0;
  // The final evaluation's (of the last committed global, as the job ends); otherwise round global_round + 1's
  // workers measured it and that round's CommitRound follows.
  bool final = false;
};
// Mark the round committed: its global is the job's latest.
struct CommitRound {
  int round = 0;
  int attempt = 0;
  double train_loss = 0;
  int num_updates = 0;
  int64_t num_samples = 0;
  std::vector<int> staleness;  // an asynchronous job's: each accepted update's, in the order they were accepted
};
// The attempt failed; the previous global stays. consecutive_failures counts this one.
struct FailRound {
  int round = 0;
  int attempt = 0;
  std::string reason;
  int consecutive_failures = 0;
};
struct JobSucceeded {
  int final_round = 0;
  std::string reason;  // set when early stopping ended the job before num_rounds
};
struct JobFailed {
  int last_committed_round = 0;
  std::string reason;
};
struct JobStopped {
  int last_committed_round = 0;  // its global is the job's result
};
struct JobCancelled {
  int last_committed_round = 0;
};

using Action = std::variant<StartRound, AssignTask, ValidateUpdate, DropWorker, AggregateRound, GlobalEvaluated,
                            CommitRound, FailRound, JobSucceeded, JobFailed, JobStopped, JobCancelled>;
using Actions = std::vector<Action>;

// An asynchronous job's update accepted into the version in progress before a restart (its record in the store): a
// restored engine takes it into the version's next attempt again (ValidateUpdate, in this order).
struct CarriedUpdate {
  WorkerId worker = 0;
  int64_t sample_count = 0;
  double train_loss = 0;
  int task_round = 0;  // its task's, which trained on global task_round - 1
  int task_attempt = 0;
};

// What a worker reports with its upload.
struct WorkerResult {
  WorkerId worker = 0;
  int round = 0;
  int attempt = 0;
  int64_t sample_count = 0;        // training examples behind the update; ignored for evaluation tasks
  double train_loss = 0;           // mean training loss of its steps; ignored for evaluation tasks
  int64_t validation_samples = 0;  // validation rows it evaluated the received global on (0: none)
  double validation_loss = 0;
};

enum class JobPhase {
  kNotStarted,
  kWaitingForWorkers,  // an attempt waits for min_workers (or, briefly, for busy selected workers)
  kWaitingToRetry,     // an attempt failed; the next one starts after the backoff
  kTraining,           // tasks are out; results arrive
  kAggregating,        // AggregateRound is with the caller
  kEvaluating,         // the final evaluation-only round (waiting for or running tasks)
  kSucceeded,
  kFailed,
  kStopped,
  kCancelled,
};
std::string_view JobPhaseName(JobPhase phase);
bool IsTerminal(JobPhase phase);

enum class ParticipantState { kTraining, kValidating, kAccepted, kRejected, kDropped };
std::string_view ParticipantStateName(ParticipantState state);

// One worker's state in the current attempt (for the API's per-worker view).
struct ParticipantView {
  WorkerId worker = 0;
  int shard = 0;
  ParticipantState state = ParticipantState::kTraining;
  std::string reason;  // why it was rejected or dropped
  int task_round = 0;  // its task's round and attempt (in an asynchronous job: possibly of an earlier version)
  int task_attempt = 0;
};

class RoundEngine {
 public:
  // Does not validate: Start and Restore check the config and answer InvalidArgument for an unusable one.
  RoundEngine(RoundEngineConfig config, const strategy::Strategy& strategy, const Clock& clock);

  // Starts a new job at round 1 with the workers idle right now. InvalidArgument for an unusable config
  // (e.g. min_workers > max_workers); FailedPrecondition if already started.
  StatusOr<Actions> Start(std::span<const WorkerId> idle_workers = {});
  // Resumes a job from its checkpoint: round last_committed_round + 1, attempt attempts_of_next_round + 1 (or the
  // final evaluation when every round is committed or early stopping's patience is used up). InvalidArgument if the
  // checkpoint does not fit the config. `carried`: an asynchronous job's updates accepted into that version before
  // the restart, each announced again (ValidateUpdate) right after the version's StartRound, in this order, so that
  // no accepted update is lost; InvalidArgument for one of a worker without a shard, or in a synchronous job.
  StatusOr<Actions> Restore(const EngineCheckpoint& checkpoint, std::span<const WorkerId> idle_workers = {},
                            std::span<const CarriedUpdate> carried = {});

  // The worker is online and idle (polling for a task). Ignored for workers not eligible for this job (including,
  // for workers_hold_data, a worker without data), and in terminal phases.
  Actions WorkerAvailable(WorkerId worker);
  // The worker's session ended (missed heartbeats, goodbye, closed connection).
  Actions WorkerDisconnected(WorkerId worker);

  // A worker uploaded its result. OK with no actions for a repeat of an already received result; OK with
  // DropWorker when the report itself is unacceptable (sample count, non-finite loss); OK with ValidateUpdate
  // otherwise. FailedPrecondition for a result of another round or attempt, from a worker without that task or
  // dropped from it, or after the job ended.
  StatusOr<Actions> ResultUploaded(const WorkerResult& result);
  // What ResultUploaded would say, without changing anything: true when the worker's result for (round, attempt) is
  // expected now, false for a repeat of one already received, and its FailedPrecondition otherwise. Lets the caller
  // skip reading a report's update when the engine would refuse or ignore it.
  StatusOr<bool> ExpectsResult(WorkerId worker, int round, int attempt) const;
  // The task failed before a result came (the worker's download, trainer or upload; or the coordinator could not
  // prepare it): the worker is dropped from the attempt with `reason` as given (and stays online). FailedPrecondition,
  // changing nothing, for another round or attempt, a worker without that task, or one that already reported or was
  // dropped.
  StatusOr<Actions> TaskFailed(WorkerId worker, int round, int attempt, std::string_view reason);
  // The caller's verdict on an update announced by ValidateUpdate: OK (it counted) or the reason it was rejected.
  // FailedPrecondition if no such validation is pending (e.g. the job was cancelled meanwhile).
  StatusOr<Actions> UpdateValidated(WorkerId worker, int round, int attempt, const Status& verdict);
  // The outcome of AggregateRound: OK once the new global is durable; an error fails the round.
  // FailedPrecondition if that aggregation is not pending.
  StatusOr<Actions> AggregationFinished(int round, int attempt, const Status& outcome);

  // Applies timeouts due at clock.Now(). Call when next_deadline() passes (or on any timer; extra calls are free).
  Actions Tick();
  // Stop: finish with the latest committed global. Cancel: end now. No actions in terminal phases.
  Actions Stop();
  Actions Cancel();

  JobPhase phase() const { return phase_; }
  int round() const { return round_; }  // the round in progress (num_rounds + 1 while evaluating)
  int attempt() const { return attempt_; }
  int last_committed_round() const { return checkpoint_.last_committed_round; }
  // When Tick() next has work to do; nullopt when no timeout is pending.
  std::optional<Clock::TimePoint> next_deadline() const;
  const EngineCheckpoint& checkpoint() const { return checkpoint_; }
  std::vector<ParticipantView> participants() const;
  // How many of participants() are not dropped (without copying them).
  int ParticipantsNotDropped() const;
  // Whether the config lets the worker take part (any worker when eligible_workers is empty).
  bool IsEligible(WorkerId worker) const;
  // Whether the worker's task (round, attempt) is still in training (not reported, dropped or ended).
  bool TaskOpen(WorkerId worker, int round, int attempt) const;

 private:
  struct Participant {
    WorkerId worker = 0;
    int shard = 0;
    ParticipantState state = ParticipantState::kTraining;
    std::string reason;
    int64_t sample_count = 0;
    double train_loss = 0;
    int64_t validation_samples = 0;
    double validation_loss = 0;
    int task_round = 0;  // its task's (round_, attempt_ in a synchronous job)
    int task_attempt = 0;
    Clock::TimePoint task_deadline{};  // asynchronous jobs: when the task is dropped as a straggler
    int64_t accepted_order = 0;        // asynchronous jobs: when its update was accepted (the buffer's order)
  };
  enum class Presence { kOffline, kIdle, kBusy };

  Status CheckConfig() const;
  // The shard bound to the worker, binding one now if the worker is eligible and one is free (see num_shards).
  std::optional<int> ShardOf(WorkerId worker);
  // Rebuilds what is derived from checkpoint_.shards and presence_ (after Restore replaced the checkpoint).
  void RecountFromCheckpoint();
  void SetPresence(WorkerId worker, Presence presence);
  // Adds delta to the count of bound workers in `presence` (workers without a shard are not counted).
  void CountPresence(WorkerId worker, Presence presence, int delta);
  // Every participant state change goes through here: it keeps the open and training counts.
  void SetState(Participant& p, ParticipantState state);
  // Whether an available worker can take part: eligible and, for workers_hold_data, holding data.
  bool CanTakePart(WorkerId worker) const;
  Participant* FindParticipant(WorkerId worker);
  const Participant* FindParticipant(WorkerId worker) const;
  void BeginAttempt(Actions& out);
  void TryAssign(Actions& out);
  void CheckRoundComplete(Actions& out);
  // AggregateRound of the `accepted` participants' updates, in that order.
  void PushAggregate(const std::vector<const Participant*>& accepted, Actions& out);
  void Drop(Participant& p, DropCause cause, std::string reason, Actions& out);
  void FailAttempt(std::string reason, Actions& out);
  void Commit(Actions& out);
  void FinishEvaluation(Actions& out);
  // GlobalEvaluated for the participants' validation losses of global `global_round`, if any were measured.
  void EmitEvaluation(int global_round, bool final, Actions& out);
  std::string EarlyStopReason() const;
  // success_reason: JobSucceeded's (an early stop's); the other ends carry none or add their own.
  void EndJob(JobPhase terminal, Actions& out, std::string success_reason = "");
  std::string AttemptName() const;
  // Whether the waiting attempt may send its tasks now: see the join rule in the header comment.
  // Whether tasks may go out now with `idle_candidates` idle workers, `needed` of them at least (the join window).
  bool ReadyToAssign(int idle_candidates, int needed);

  // Asynchronous rounds (round_engine_async.cc).
  // A version begins: the accepted, rejected and dropped entries of the last one go, tasks in training stay.
  // `carried` (a restored job's) are announced again right after its StartRound.
  void BeginVersion(Actions& out, std::span<const CarriedUpdate> carried = {});
  // Gives tasks to idle workers while fewer than max_concurrency train.
  void TryAssignAsync(Actions& out);
  // AggregateRound once buffer_size updates are accepted.
  void CheckBufferFull(Actions& out);
  // Versions committed since the participant's task started from its global.
  int Staleness(const Participant& p) const { return round_ - p.task_round; }
  // Drops tasks in training past their deadline (stragglers).
  void DropOverdueTasks(Actions& out);
  std::optional<Clock::TimePoint> NextTaskDeadline() const;
  // The async check of a result's (round, attempt) against the worker's task: FailedPrecondition naming why.
  Status CheckAsyncResult(const Participant* p, WorkerId worker, int round, int attempt) const;

  RoundEngineConfig config_;
  const strategy::Strategy& strategy_;
  const Clock& clock_;

  JobPhase phase_ = JobPhase::kNotStarted;
  int round_ = 0;
  int attempt_ = 0;
  bool stop_requested_ = false;
  Clock::TimePoint deadline_{};
  // When a waiting attempt stops waiting for busy selected workers (set once min_workers are idle).
  std::optional<Clock::TimePoint> join_deadline_;
  std::vector<Participant> participants_;
  // Indexes and counts kept beside the state they summarise, so that one worker's event costs O(log N), not a scan
  // of every worker (a job may have 10,000 of them: scans per event made rounds quadratic).
  std::unordered_map<WorkerId, size_t> participant_index_;  // worker -> position in participants_
  int open_participants_ = 0;                               // kTraining or kValidating
  int training_participants_ = 0;
  std::map<WorkerId, Presence> presence_;
  int idle_bound_workers_ = 0;       // idle, with a shard bound: the candidates of the next assignment
  int busy_bound_workers_ = 0;       // busy, with a shard bound: selected workers the join window may wait for
  int unseen_selected_workers_ = 0;  // listed in eligible_workers, never heard from: the join window waits for them too
  std::unordered_map<WorkerId, int> eligible_position_;  // config_.eligible_workers, inverted
  std::vector<char> slot_taken_;                         // slot mode: shard -> bound to some worker
  int first_free_slot_ = 0;                              // no slot below it is free (slots are never released)
  EngineCheckpoint checkpoint_;
  int64_t accepted_updates_ = 0;  // asynchronous jobs: updates accepted so far (their order)
};

}  // namespace parsyn::coordinator
