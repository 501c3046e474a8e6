// JobRunner: one active training job on the coordinator's event loop, on a JobHost (job_host.h: the service, or a
// test's fake). It owns the job's RoundEngine and Aggregator (aggregator.h: the strategy, strategy::MakeStrategy from
// the spec's distributed.strategy) and carries out the engine's actions in order: every transition is written to the
// metadata store (and an event appended) before the request that caused it is answered; validating and accumulating an
// update, and writing the new global, run on the host's thread pool.
//
// Events for a job are handled one at a time (a loop::LoopMutex), each with all of its actions, including the
// follow-ups from validation and aggregation, before the next one starts.
//
// Blob keys of a job (generated here, never from user input):
//   jobs/<id>/shards/<nnnnn>.{train,validation}.<jsonl|csv> written once per job (none when data.source is
//                                                            "workers": its shards are slots without data); one
//                                                            directory for all: 10,000 directories more made
//                                                            setup twice as slow on ext4
//   jobs/<id>/rounds/000000/global.safetensors              round 1's LoRA adapters (full fine-tuning: the model's
//                                                            model.safetensors blob serves as the initial global)
//   jobs/<id>/rounds/<rrrrrr>-a<a>/global.safetensors       the global committed by round r (attempt a)
//   jobs/<id>/rounds/<rrrrrr>-a<a>/server_state.safetensors the strategy's server state after round r (server
//                                                            optimizers: their moments); its sha256 is in the
//                                                            global's metadata (kServerStateShaKey), so the global's
//                                                            recorded sha256 vouches for it on a restart
//   jobs/<id>/rounds/<rrrrrr>-a<a>/updates/w<worker>.safetensors   a worker's update (signed PUT URL)
//   jobs/<id>/artifacts/adapter_config.json                 the final (and best) adapter's PEFT config
//
// Store errors: when an action's durable write fails (StartRound, AssignShard, RecordUpdate, CommitRound, FailRound,
// ...), the engine has already moved past what the store holds. The rest of its actions is dropped, the attempt's
// tasks abandoned, and the job reloaded from the store as on a restart (Resync): the attempt in flight is failed
// (not counted toward fault_tolerance) and the round retried as a new attempt from the last committed global. While
// the store still fails, events are refused (Unavailable) and the reload is retried on Tick every
// kResyncRetryInterval.
//
// Restart: Launch() of a running job fails the attempt that was in flight (not counted toward fault_tolerance),
// rebuilds the engine checkpoint from the store (committed round, attempts, failures, shard owners) and resumes at
// the last committed round + 1, so no committed round is lost, skipped or repeated.
//
// Files: job_runner.cc (events in, actions out: Handle/Execute/Do), job_runner_setup.cc (Setup, Resume, LoadGlobal),
// job_runner_tasks.cc (round start, tasks and their upload grants), job_runner_updates.cc (results, update checks and
// records), job_runner_commit.cc (aggregation, commit, failed rounds, the job's end and artifacts),
// job_runner_secure.cc (secure aggregation's attempts). Its state of the
// attempt in progress is an AttemptState (attempt_state.h), its global model a GlobalWeights (global_weights.h).
//
// Threads: loop thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/aggregator.h"
#include "coordinator/attempt_state.h"
#include "coordinator/global_weights.h"
#include "coordinator/job_host.h"
#include "coordinator/job_spec.h"
#include "coordinator/rank_globals.h"
#include "coordinator/round_engine.h"
#include "coordinator/secure_round.h"
#include "loop/loop_tools.h"
#include "loop/signal.h"
#include "protocol/messages.h"
#include "secagg/update_vector.h"
#include "storage/metadata_store.h"
#include "strategy/strategy.h"
#include "weights/safetensors_stream_check.h"
#include "weights/update_wire.h"
#include "weights/weight_set.h"

namespace parsyn::coordinator {

// A worker's POST /api/v1/worker/result body as the runner takes it (the protocol routes and `parsyn simulate`'s
// virtual workers): a loss the worker did not send counts as 0.
ResultReport ToResultReport(protocol::Result result);

class JobRunner {
 public:
  JobRunner(JobHost& host, storage::TrainingJob job, JobSpec spec);
  ~JobRunner();

  int64_t id() const { return job_.id; }
  bool finished() const;
  // The job's project.
  int64_t project_id() const { return job_.project_id; }
  // Sets up a queued job (shards, initial global; then running) and starts round 1, or resumes a running job.
  // On error the job is marked failed with the reason.
  http::Awaitable<Status> Launch();

  // Whether this job may give the worker a task (listed, or any worker for mode auto).
  bool IsEligible(int64_t worker_id) const;
  // The worker asks for a task. still_available runs under the job's mutex, right before the engine hears of it:
  // false means the offer went stale while waiting (the worker got a task meanwhile) and it is ignored.
  http::Awaitable<void> WorkerAvailable(int64_t worker_id, std::function<bool()> still_available = {});
  http::Awaitable<void> WorkerDisconnected(int64_t worker_id);
  // A worker's result. Returns {"status": "accepted" | "rejected" | "duplicate" | "evaluated", "reason"}.
  // FailedPrecondition for a late or unexpected result (see RoundEngine::ResultUploaded).
  http::Awaitable<StatusOr<nlohmann::json>> Result(int64_t worker_id, ResultReport report);
  // The worker says its task of this attempt failed (POST /api/v1/worker/failure): it leaves the attempt with the
  // reason. FailedPrecondition when that task is not in training any more (reported, dropped, another attempt).
  http::Awaitable<Status> TaskFailed(int64_t worker_id, int round, int attempt, std::string reason);
  // Applies due timeouts.
  http::Awaitable<void> Tick();
  bool TickDue() const;
  // Stop (finish with the latest committed global) or cancel; FailedPrecondition once the job has ended. One that
  // arrives while the job is being set up or resumed waits for that to finish (setting up a large dataset takes
  // seconds), rather than being refused.
  http::Awaitable<Status> Stop();
  http::Awaitable<Status> Cancel();

  // In-memory progress for GET /training-jobs/{id}: phase, round, attempt, per-worker state and progress.
  nlohmann::json LiveView() const;
  // LiveView's phase and round (when it shows one) with the count of participants not dropped, "active_workers":
  // the event feed's job_live, published every batch interval, without building every worker's entry.
  nlohmann::json LiveSummary() const;
  // A worker's progress report within the current attempt (for LiveView).
  void RecordProgress(int64_t worker_id, const nlohmann::json& progress);
  // Largest accepted update upload for a key of this job (the global's size plus header room); nullopt if the key
  // is not an update key of the current attempt.
  std::optional<uint64_t> UpdateSizeCap(std::string_view blob_key) const;
  // Bytes of this job's blobs that crossed the wire, down to a worker or up from one: counted in the attempt in
  // progress (its round's record) and in /metrics (parsyn_job_blob_bytes_total{direction}).
  void AddBytesDown(uint64_t bytes);
  void AddBytesUp(uint64_t bytes);

  // Secure aggregation (job_runner_secure.cc, docs/secure-aggregation.md). The secure attempt a worker's message
  // names, when it is the attempt in progress and the worker takes part in it (FailedPrecondition naming why
  // otherwise): the worker routes exchange the attempt's messages with it directly on the loop, without the job's
  // mutex, and call SecureChanged after each, which wakes the aggregation waiting for the shares.
  StatusOr<SecureRound*> SecureAttempt(int64_t worker_id, int round, int attempt);
  void SecureChanged() { secure_changed_.Notify(); }
  // How each worker of the secure attempt makes its input: the bound on its sample count (its weight is samples /
  // this), and dp_fedavg's distributed noise.
  const secagg::InputRule& secure_input() const { return secure_input_; }

  // Updates checked as they stream in (PUT /blobs, blob_routes.cc), so CheckUpdateFile need not read their values
  // again: a checker for an upload to `blob_key` (nullptr where this job's updates are not checked that way:
  // compressed updates, no global yet), and, once its verdict is OK, what it found about the bytes it saw
  // (StreamChecked, attempt_state.h).
  std::shared_ptr<weights::SafetensorsStreamChecker> NewUploadChecker(std::string_view blob_key) const;
  void RememberCheckedUpload(const std::string& blob_key, StreamChecked checked) {
    attempt_.RememberCheckedUpload(blob_key, std::move(checked));
  }

 private:
  // The phase, round and attempt LiveView and LiveSummary show. Needs engine_.
  nlohmann::json LivePhase() const;
  // Updates checked early and held at once (AttemptState::MaxEarlyCheckedUpdates), for this job's updates.
  size_t MaxEarlyCheckedUpdates() const;
  // Result's early check: reading and checking an update is the slow part of a result, so it is done before waiting
  // for the job's mutex and results check in parallel on the pool; only the accumulation is serial. Bounded (by
  // MaxEarlyCheckedUpdates), since a checked update is held in memory until its turn; beyond the bound the check
  // runs under the mutex, in OnValidateUpdate.
  http::Awaitable<void> CheckUpdateEarly(int64_t worker_id, const ResultReport& report);

  http::Awaitable<Status> Setup();
  http::Awaitable<Status> Resume();
  // Loads the global weights of `key`, checking their bytes against `sha256` (the metadata store's record; empty:
  // none): DataLoss naming the blob, the expected and the actual sha256 on a mismatch.
  http::Awaitable<Status> LoadGlobal(std::string_view key, std::string_view sha256);
  // A stateful strategy (has_state): restores the server state stored with the global just loaded (global_), or the
  // initial state when no round was committed. DataLoss when the state blob is missing or not the one recorded.
  http::Awaitable<Status> LoadServerState();
  // The starting global's key (set in *key) and the sha256 it must have: the model file's recorded one, or for a
  // PEFT job that of the deterministic initial adapters (empty when they cannot be made: the load then says why).
  std::string InitialGlobalSha256(std::string* key) const;
  // Reloads the job from the store (model, dataset, shards, job, global of the last committed round), failing the
  // attempt still running there with the reason given, and returns the engine checkpoint to resume from.
  http::Awaitable<StatusOr<EngineCheckpoint>> LoadCheckpoint(std::string running_attempt_failure);
  // LoadCheckpoint's parts: the job's records as stored, with the attempt that was running failed with
  // `running_attempt_failure` (blocking: on the pool); and the engine's checkpoint they give (the committed global's
  // key and sha256 into `global_key` and `global_sha`, when there is one), which also sets the shards' row counts.
  struct StoredJob {
    storage::Model model;
    storage::Dataset dataset;
    std::vector<storage::Shard> shards;
    std::vector<std::string> validation_sha256;
    std::vector<storage::Round> rounds;
    storage::TrainingJob job;
    bool local_sizes_warned = false;
    // An asynchronous job: the updates accepted into the version that was running, in the order they were accepted.
    std::vector<storage::RoundUpdate> carried;
  };
  StatusOr<StoredJob> ReadStoredJob(const std::string& running_attempt_failure, int64_t now);
  EngineCheckpoint CheckpointFrom(const std::vector<storage::Round>& rounds, std::string& global_key,
                                  std::string& global_sha);
  // After a failed action (resync_needed_): LoadCheckpoint and a new engine restored from it. Under the job's mutex.
  http::Awaitable<Status> Resync();
  // The outcome of Setup's or Resume's start: OK when the engine started, even if an action failed (Resync retries).
  Status StartedOrRecovering(const Status& started) const;
  // Runs one engine event under the job's mutex and carries out its actions. Callers create the awaitable before
  // co_awaiting it, so the std::function is never a temporary inside a co_await (kCoAwaitTemporaries).
  http::Awaitable<Status> Handle(std::function<StatusOr<Actions>()> event);
  // Handle's part under the job's mutex: the event, its actions, and a resync when one is due.
  http::Awaitable<Status> HandleLocked(std::function<StatusOr<Actions>()> event);
  // Group commit: queues the job's records and events (host_.QueueJobWrites) and keeps the ticket; Handle waits for
  // it once the mutex is released. Returns the ticket.
  WriteQueue::TicketPtr QueueWrites(std::vector<storage::BatchWrite> records, std::vector<JobHost::QueuedEvent> events);
  // Waits until every write this runner queued is durable: the first error among them since the last resync (a
  // write the runner makes directly — StartRound, CommitRound, FailRound, the job's status — comes after them).
  http::Awaitable<Status> DrainWrites();
  // Takes the finished tickets off outstanding_writes_, keeping the first error in write_error_.
  void CollectWriteErrors();
  // Delivers a task whose writes are durable, unless it went stale meanwhile (dropped, another attempt, job ended).
  void DeliverQueuedTask(int64_t worker_id);
  // Delivers, in order, the queued tasks whose batches are already applied, while Execute is still building later
  // ones (called between its slices): a round start's first workers need not wait for its last task.
  void DeliverDurableTasks();
  http::Awaitable<Status> Execute(Actions actions);
  http::Awaitable<Status> Do(const Action& action, std::deque<Action>& work);
  http::Awaitable<Status> OnStartRound(const coordinator::StartRound& a, const std::deque<Action>& work);
  http::Awaitable<Status> OnAssignTask(const AssignTask& a, const std::deque<Action>& work);
  http::Awaitable<Status> OnValidateUpdate(const ValidateUpdate& a, std::deque<Action>& work);
  // OnValidateUpdate's parts: the accepted/rejected counters, and adding the aggregation's kept updates while the job
  // is idle (`next`: the engine's actions after the verdict).
  void CountUpdateVerdict(const Status& verdict, bool file_failed);
  http::Awaitable<void> AddKeptUpdatesWhileIdle(const Actions& next, bool small_update);
  http::Awaitable<Status> OnDropWorker(const DropWorker& a);
  // Secure aggregation (job_runner_secure.cc): a training attempt's SecureRound over the participants whose tasks go
  // out together, its first batch: `first` and the tasks of its attempt that follow it in `work` (with the round's
  // start, or later when no worker was idle then). A worker whose task goes out later cannot join the attempt (its
  // routes answer 409) and leaves the round. Then a participant's masked input, read from its upload as its update
  // would be (its verdict); and, when the round aggregates, the new weights from the unmasked sum once every share is
  // in (waiting for them, at most the exchange timeout).
  Status BeginSecureAttempt(const AssignTask& first, const std::deque<Action>& work);
  http::Awaitable<Status> ValidateMaskedInput(const ValidateUpdate& a, const ResultReport& report);
  http::Awaitable<Status> OnValidateMaskedInput(const ValidateUpdate& a, const ResultReport& report,
                                                std::deque<Action>& work);
  http::Awaitable<StatusOr<weights::WeightSet>> SecureMean(int round, int attempt);
  // The job's "secure_aggregation" event of the attempt: who took part in each phase, and its outcome.
  http::Awaitable<void> RecordSecureAttempt(int round, int attempt);
  http::Awaitable<Status> OnAggregateRound(const AggregateRound& a, std::deque<Action>& work);
  // Global r-1's loss is kept for round r's commit; the final evaluation's is recorded at once.
  http::Awaitable<Status> OnGlobalEvaluated(const GlobalEvaluated& a);
  http::Awaitable<Status> OnCommitRound(const coordinator::CommitRound& a);
  http::Awaitable<Status> OnFailRound(const coordinator::FailRound& a, const std::deque<Action>& work);
  http::Awaitable<Status> OnJobEnded(storage::JobStatus status, std::string_view reason);
  http::Awaitable<Status> WriteFinalArtifacts();
  // `task_round`: the round of the worker's task (an asynchronous job's update records the global it trained on).
  http::Awaitable<Status> RecordUpdate(int64_t worker_id, int round, int attempt, const Status& verdict,
                                       int task_round);
  // data.source "workers": after an accepted update, the job's one "warning" event when the workers' local datasets
  // (their reported sample counts) are more than kLocalSizeSpread times apart.
  http::Awaitable<void> WarnOfUnevenLocalData(int64_t worker_id, int64_t sample_count);
  StatusOr<TaskMessage> BuildTask(const AssignTask& a) const;
  // LoRA ranks (job_runner_ranks.cc): the rank the worker's training task has (lora_rank_spec.h WorkerLoraRank; its
  // error refuses the task), the global at that rank when it is below the job's (made for the attempt on first use),
  // what a training task of a lower rank starts from (nullptr: the job's global), and the base a worker's update is
  // checked and decoded against (the global its task carried).
  Status ChooseLoraRank(int64_t worker_id);
  http::Awaitable<Status> MakeRankGlobal(const AssignTask& a);
  const RankGlobals::Global* LowerRankGlobal(const AssignTask& a) const;
  // Accepts a checked update into the round's aggregation: an asynchronous job's stale one rebased from `base`, the
  // global its task trained, onto the latest, and weighted by its staleness. Blocking (a pool thread) when rebasing.
  Status AcceptIntoRound(weights::WeightSet update, const ValidateUpdate& a, const weights::WeightSet& base,
                         std::optional<double> max_magnitude);
  // The global the worker's update of its task of `task_round` is checked against: the one the task trained (a lower
  // rank's, an asynchronous job's earlier version); nullptr when it is no longer held.
  std::shared_ptr<weights::WeightSet> UpdateBase(int64_t worker_id, int task_round) const;
  // Asynchronous jobs, as a version commits: the latest committed global becomes an earlier one (global_.KeepEarlier),
  // and those no task in training started from are dropped.
  void KeepGlobalsForTasksInTraining();
  // Asynchronous jobs, as a version commits or fails: deletes the updates reported in it (not its folder, which takes
  // the uploads of its tasks still in training).
  void DeleteVersionUpdates();
  int64_t ModelBytes() const;  // the model's files, for config.lora_r "auto"
  // The task's "update_upload": the host's blob_urls() create-only PUT (the coordinator's signed /blobs URL, or an S3
  // presigned PUT with the headers the worker must send), or part URLs when a multipart upload was started for it.
  StatusOr<protocol::UpdateUpload> UpdateUploadGrant(int64_t worker_id, const std::string& key) const;
  // Starts a multipart upload for the worker's update when the store has them (blob_urls().multipart(), S3) and the
  // job's updates may exceed its multipart threshold.
  http::Awaitable<Status> StartMultipartUploadIfLarge(int64_t worker_id, std::string key);  // by value: a coroutine
  // Completes the worker's multipart upload of `key`, if one was started (before its update is checked).
  http::Awaitable<void> CompleteMultipartUpload(int64_t worker_id, std::string key);
  // Multipart stores: discards the parts of uploads under `prefix` (an attempt's, or RoundsPrefix()) that never
  // completed. When the store cannot be reached, the next call sweeps all of RoundsPrefix() instead, so an outage
  // leaves no parts behind once the store is back (the job's end sweeps it anyway).
  http::Awaitable<void> AbortIncompleteUploads(std::string prefix);
  // Deletes the updates under `prefix` (an ended attempt's "<attempt>/updates/") on the pool, without waiting: once
  // an attempt is committed or failed nothing reads them again (a restart fails an attempt in flight and never reads
  // its updates), and deleting them before they are written back keeps a round's bytes off the disk. Nothing when
  // the host keeps updates (`parsyn server --keep-updates`).
  void DeleteUpdatesInBackground(std::string prefix);
  std::string RoundsPrefix() const;  // "jobs/<id>/rounds/"
  // TaskFailed for a task the coordinator could not send, run detached (logs instead of returning).
  http::Awaitable<void> TaskFailedDetached(int64_t worker_id, int round, int attempt, std::string reason);
  http::Awaitable<void> AwaitLaunched();
  std::string AttemptPrefix(int round, int attempt) const;
  std::string UpdateKey(int round, int attempt, int64_t worker_id) const;
  // The job's distributed.compression as the codec library's settings (docs/compression.md "In jobs").
  weights::WireEncoding UpdateEncoding() const;
  // Largest accepted update upload: the global's size plus header room, plus zstd's worst-case framing with zstd.
  uint64_t MaxUpdateUploadBytes() const;
  // zstd_level > 0: writes the attempt's zstd copy of the global (global_.zstd_copy()), which its tasks offer the
  // workers.
  // On failure the tasks offer the plain global only (logged).
  http::Awaitable<void> WriteGlobalZstdCopy(int round, int attempt);

  JobHost& host_;
  storage::TrainingJob job_;
  JobSpec spec_;
  RoundEngineConfig engine_config_;
  const std::string task_config_json_;  // spec_.config as every task carries it, dumped once
  Aggregator aggregator_;               // the job's strategy, its round aggregation and the work of aggregating
  std::unique_ptr<RoundEngine> engine_;
  loop::LoopMutex mutex_;
  loop::Signal launched_;  // notified when Launch has finished (the engine exists, or the job ended)
  bool ended_ = false;
  static constexpr Clock::Duration kResyncRetryInterval = std::chrono::seconds(1);
  bool resync_needed_ = false;  // an action failed: the engine is ahead of the store (see Store errors above)
  // Group commit: this runner's queued writes not yet known durable (in queue order), and the first error of a batch
  // among them since the last resync (it makes the job resync as a failed single write does).
  std::deque<WriteQueue::TicketPtr> outstanding_writes_;
  Status write_error_;
  // Tasks built and waiting for their writes (shard assignment, participant, event) to be durable, by worker; and the
  // workers whose tasks the event being handled queued (Handle delivers them after its writes' batch).
  struct QueuedTask {
    TaskMessage task;
    std::chrono::steady_clock::time_point queued_at{};  // parsyn_round_phase_duration_seconds{phase="task_store"}
    WriteQueue::TicketPtr written;                      // the batch holding its records: it goes out once applied
  };
  std::map<int64_t, QueuedTask> undelivered_tasks_;
  std::vector<int64_t> tasks_to_deliver_;
  std::string resync_reason_;
  Clock::TimePoint resync_after_{};

  storage::Model model_;
  storage::Dataset dataset_;
  std::vector<storage::Shard> shards_;
  std::vector<std::string> validation_sha256_;  // by shard index: each shard's validation file's (tasks carry it)
  // The latest committed global, the attempt's zstd copy of it, the attempt's aggregated global not yet committed, and
  // the validation loss stored with the commit.
  GlobalWeights global_;
  RankGlobals rank_globals_;  // LoRA: each participant's rank, and the globals at the lower ranks, for the attempt
  // Secure aggregation: the attempt's SecureRound (none for a job without it, or before the first training attempt),
  // how its workers make their inputs, and the signal its messages notify.
  std::optional<SecureRound> secure_;
  secagg::InputRule secure_input_;
  loop::Signal secure_changed_;
  // The attempt in progress: results, progress, recorded updates and verdicts, updates checked early, multipart
  // uploads, bytes moved; and the uploads checked as they streamed in.
  AttemptState attempt_;
  bool abort_sweep_pending_ = false;  // an abort of incomplete uploads failed (store down): sweep the whole job next
  // data.source "workers": the latest accepted sample count of each worker, and whether the job's "warning" event
  // about local datasets of very different sizes was appended (once per job: a resumed job finds it in the store).
  std::map<int64_t, int64_t> local_sample_counts_;
  bool local_sizes_warned_ = false;
  // An asynchronous job reloaded from the store (LoadCheckpoint): the updates accepted into the version that was
  // running, carried into its next attempt (RoundEngine::Restore's `carried`; their reports are registered when it
  // starts, OnStartRound), so that a restart loses no accepted update.
  std::vector<storage::RoundUpdate> carried_updates_;
  std::vector<CarriedUpdate> CarriedForEngine() const;
  // Loads the earlier globals the carried updates trained on (global_.KeepEarlier); one that cannot be read drops
  // its updates from carried_updates_ (logged). Needs the stored rounds.
  http::Awaitable<void> LoadGlobalsOfCarriedUpdates(const std::vector<storage::Round>& rounds);
  // The task (round, attempt) whose update key `key` is for worker `worker_id` (UpdateKey's inverse); nullopt for a
  // key the job did not make.
  std::optional<std::pair<int, int>> TaskOfUpdateKey(const std::string& key, int64_t worker_id) const;
};

}  // namespace parsyn::coordinator
