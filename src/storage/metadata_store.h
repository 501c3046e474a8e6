// MetadataStore: the coordinator's durable records (datasets, models, workers, jobs, shards, rounds, updates,
// metrics, events), as typed structs.
//
// Implementations: SQLite (sqlite_store.h, the default); PostgreSQL (postgres_store.h), both one SQL implementation
// (sql/sql_metadata_store.h). Every implementation passes the contract suite in metadata_store_contract.h.
//
// Contract for every call:
// - A call that returns OK has made its change durable (it survives kill -9 and power loss); a call that fails has
//   changed nothing. Calls that change several records (StartRound, CommitRound, FailRound, CreateShards) do so in
//   one transaction: after a crash the store holds the old state or the new one, never a mix.
// - Ids are positive and assigned by the store on Create; timestamps are Unix milliseconds supplied by the caller
//   (from its injected clock), so the store itself never reads a clock.
// - Errors: NotFound naming the kind and id ("training job 7 not found"); AlreadyExists for a taken unique key;
//   FailedPrecondition for a transition the current state does not allow or a delete of something still referenced;
//   InvalidArgument for a malformed record; Unavailable when the database cannot be reached or written.
// - Thread-safety: every method may be called from any thread; implementations serialise internally. Calls block on
//   disk (fsync per commit), so the coordinator makes them off its event-loop thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"

namespace parsyn::storage {

// The project everything made before projects existed belongs to (schema migration 6), named "default".
inline constexpr int64_t kDefaultProjectId = 1;

enum class DatasetFormat { kJsonl, kCsv };
enum class DatasetKind { kText, kPromptCompletion, kTabular };
enum class WorkerKind { kOwn, kManaged };
enum class WorkerStatus { kOffline, kOnline, kBusy };
enum class JobStatus { kQueued, kRunning, kSucceeded, kFailed, kStopped, kCancelled };
enum class RoundStatus { kRunning, kCommitted, kFailed };
enum class UpdateStatus { kAccepted, kRejected };
// A member's role in a project, lowest first: viewer reads, editor also changes datasets, models, workers and jobs,
// owner also manages the members.
enum class ProjectRole { kViewer, kEditor, kOwner };

// Lowercase names as the API and the database spell them: "jsonl", "prompt_completion", "own", "busy", "queued",
// "committed", "rejected", ... Parse* return InvalidArgument naming the unknown value and the accepted ones.
std::string_view ToString(DatasetFormat v);
std::string_view ToString(DatasetKind v);
std::string_view ToString(WorkerKind v);
std::string_view ToString(WorkerStatus v);
std::string_view ToString(JobStatus v);
std::string_view ToString(RoundStatus v);
std::string_view ToString(UpdateStatus v);
std::string_view ToString(ProjectRole v);
StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view s);
StatusOr<DatasetKind> ParseDatasetKind(std::string_view s);
StatusOr<WorkerKind> ParseWorkerKind(std::string_view s);
StatusOr<WorkerStatus> ParseWorkerStatus(std::string_view s);
StatusOr<JobStatus> ParseJobStatus(std::string_view s);
StatusOr<RoundStatus> ParseRoundStatus(std::string_view s);
StatusOr<UpdateStatus> ParseUpdateStatus(std::string_view s);
StatusOr<ProjectRole> ParseProjectRole(std::string_view s);
// succeeded, failed, stopped, cancelled: no further status change is allowed.
bool IsTerminal(JobStatus status);

struct Dataset {
  int64_t id = 0;  // assigned by CreateDataset
  std::string name;
  DatasetFormat format = DatasetFormat::kJsonl;
  DatasetKind kind = DatasetKind::kText;
  int64_t row_count = 0;
  int64_t size_bytes = 0;
  std::string sha256;
  std::string blob_key;
  int64_t created_at_ms = 0;
  int64_t project_id = kDefaultProjectId;

  friend bool operator==(const Dataset&, const Dataset&) = default;
};

// One file of an uploaded model folder ("config.json", "model.safetensors", "tokenizer.json", ...).
struct ModelFile {
  std::string path;  // relative to the model folder
  std::string blob_key;
  int64_t size_bytes = 0;
  std::string sha256;

  friend bool operator==(const ModelFile&, const ModelFile&) = default;
};

struct Model {
  int64_t id = 0;  // assigned by CreateModel
  std::string name;
  std::string model_type;        // config.json's model_type / architecture, e.g. "llama"
  std::string config_json;       // config.json as uploaded
  std::vector<ModelFile> files;  // paths unique within the model
  int64_t size_bytes = 0;
  int64_t created_at_ms = 0;
  int64_t project_id = kDefaultProjectId;

  friend bool operator==(const Model&, const Model&) = default;
};

struct Worker {
  int64_t id = 0;  // assigned by CreateWorker
  std::string name;
  WorkerKind kind = WorkerKind::kOwn;
  std::string token_sha256;  // hash of the worker's token; the token itself is never stored. Unique.
  std::string device;        // as the worker last reported it, e.g. "cuda:0 NVIDIA H200"; empty before hello
  // The trainers its last hello announced, as protocol::OfferedTrainersToJsonText writes them; empty before hello.
  std::string trainers_json;
  WorkerStatus status = WorkerStatus::kOffline;
  std::optional<int64_t> last_heartbeat_at_ms;
  bool revoked = false;
  int64_t created_at_ms = 0;
  int64_t project_id = kDefaultProjectId;  // an own worker's project; a managed worker serves every project

  friend bool operator==(const Worker&, const Worker&) = default;
};

// When a worker was last seen (a heartbeat, a poll), for RecordWorkersSeen.
struct WorkerSeen {
  int64_t worker_id = 0;
  int64_t last_heartbeat_at_ms = 0;
};

struct TrainingJob {
  int64_t id = 0;  // assigned by CreateJob
  std::string name;
  int64_t dataset_id = 0;  // must name an existing dataset; 0: none (the workers train on their own data)
  int64_t model_id = 0;    // must name an existing model
  int64_t project_id = kDefaultProjectId;  // its dataset and model must be the project's
  std::string spec_json;                   // the full request body as validated, defaults filled in
  JobStatus status = JobStatus::kQueued;
  std::string failure_reason;   // set with kFailed
  std::string status_reason;    // why the job reached its terminal status, when given (e.g. it stopped early)
  int32_t current_round = 0;    // the round being run (or last run); 0 before the first
  int32_t committed_round = 0;  // the last committed round; 0 before the first commit
  int32_t consecutive_failed_rounds = 0;
  int64_t created_at_ms = 0;
  std::optional<int64_t> started_at_ms;
  std::optional<int64_t> finished_at_ms;
  // 64 hex digits (256 bits from getrandom) drawn when the job is created, kept here alone: never in the API, the
  // spec, logs, events or artifacts. dp_fedavg draws its noise and client sample under it (strategy/dp_fed_avg.h),
  // so a released global's noise cannot be regenerated from anything a user can read, and a resumed job draws the
  // same. Set by the caller of CreateJob; the store keeps it as given.
  std::string private_seed;
  // Validation losses, each of one set of weights: the starting weights (measured by round 1's workers), the global
  // of the last committed round (measured by the final evaluation), and the committed round whose global had the
  // lowest loss so far (the earliest on a tie). Kept by CommitRound and RecordFinalValidationLoss; null until known.
  std::optional<double> initial_validation_loss;
  std::optional<double> final_validation_loss;
  std::optional<int32_t> best_round;
  std::optional<double> best_validation_loss;

  friend bool operator==(const TrainingJob&, const TrainingJob&) = default;
};

// A file the job produced (the final adapter, a kept per-round global, ...).
struct JobArtifact {
  int64_t job_id = 0;
  std::string name;  // unique within the job, e.g. "adapter_model.safetensors", "rounds/000003/global.safetensors"
  std::string blob_key;
  int64_t size_bytes = 0;
  std::string sha256;
  int64_t created_at_ms = 0;

  friend bool operator==(const JobArtifact&, const JobArtifact&) = default;
};

// A job's slice of the dataset. Written once per job; with worker selection mode auto, shards start unassigned and
// AssignShard gives each to a worker, which keeps it for the whole job.
struct Shard {
  int64_t job_id = 0;
  int32_t shard_index = 0;           // 0-based, unique within the job
  std::optional<int64_t> worker_id;  // unique within the job when set
  std::string blob_key;
  std::string sha256;
  int64_t train_rows = 0;
  int64_t validation_rows = 0;
  // Training rows per label, as a JSON object {"<label>": count, ...} of the labels present (coordinator/partition.h);
  // "" when the job's data has no label to count (a JSONL dataset split iid without distributed.partition.label).
  std::string label_histogram_json;

  friend bool operator==(const Shard&, const Shard&) = default;
};

// One attempt at one round. A failed round is retried with the same number and attempt + 1.
struct Round {
  int64_t job_id = 0;
  int32_t round = 0;    // 1-based
  int32_t attempt = 0;  // 1-based
  RoundStatus status = RoundStatus::kRunning;
  std::vector<int64_t> participants;  // worker ids: selected when the round started, or given a task later
  int64_t started_at_ms = 0;
  std::optional<int64_t> ended_at_ms;
  std::optional<double> train_loss;  // sample-weighted mean of the workers' mean training losses
  // Sample-weighted validation loss of the global this round committed ("after round r"): measured by round r+1's
  // workers before they train on it (or by the final evaluation for the last round). Null until then, and on
  // attempts that did not commit.
  std::optional<double> validation_loss;
  // Bytes of the job's blobs that crossed the wire in this attempt: down to the workers and up from them
  // (docs/compression.md, "Bytes"), and their sum. The split is null on rows written before it was recorded.
  int64_t bytes_moved = 0;
  std::optional<int64_t> bytes_down;
  std::optional<int64_t> bytes_up;
  std::string global_blob_key;  // the committed global; empty unless committed
  std::string global_sha256;
  std::string failure_reason;  // set when failed

  friend bool operator==(const Round&, const Round&) = default;
};

// Everything CommitRound records, in one transaction.
struct RoundCommit {
  int64_t job_id = 0;
  int32_t round = 0;
  int32_t attempt = 0;
  std::string global_blob_key;  // required: the new global, already a durable blob
  std::string global_sha256;    // required
  int64_t ended_at_ms = 0;
  std::optional<double> train_loss;
  // The loss of the global this round started from, as its workers measured it: recorded as round - 1's
  // validation_loss (for round 1: the job's initial_validation_loss), and round - 1 becomes best_round if lower.
  std::optional<double> previous_global_validation_loss;
  int64_t bytes_down = 0;  // stored with their sum as bytes_moved
  int64_t bytes_up = 0;

  friend bool operator==(const RoundCommit&, const RoundCommit&) = default;
};

// Everything FailRound records, in one transaction.
struct RoundFailure {
  int64_t job_id = 0;
  int32_t round = 0;
  int32_t attempt = 0;
  std::string reason;  // required, e.g. "1 of min_workers 2 reported within aggregation_timeout 600 s"
  int64_t ended_at_ms = 0;
  int64_t bytes_down = 0;  // stored with their sum as bytes_moved
  int64_t bytes_up = 0;
  // False for a round abandoned through no fault of the workers (the coordinator restarted mid-round): the job's
  // consecutive_failed_rounds is left as it is.
  bool counts_toward_fault_tolerance = true;
  // When set, the job also becomes failed with this reason (fault_tolerance consecutive failures reached).
  std::optional<std::string> fail_job_reason;

  friend bool operator==(const RoundFailure&, const RoundFailure&) = default;
};

// A worker's result for one round attempt, accepted into the aggregate or rejected with the reason.
struct RoundUpdate {
  int64_t job_id = 0;
  int32_t round = 0;
  int32_t attempt = 0;
  int64_t worker_id = 0;  // one update per worker per round attempt
  std::string blob_key;
  std::string sha256;
  int64_t size_bytes = 0;
  int64_t num_samples = 0;
  std::optional<double> train_loss;
  std::string metrics_json;  // the worker's reported metrics object, as received ("{}" when none)
  UpdateStatus status = UpdateStatus::kAccepted;
  std::string reject_reason;  // set when rejected
  int64_t received_at_ms = 0;
  // An asynchronous job's update: the committed round whose global it trained on (its staleness is round - 1 - this).
  // Null for a synchronous job's, which trained on round - 1's.
  std::optional<int32_t> trained_on_round;

  friend bool operator==(const RoundUpdate&, const RoundUpdate&) = default;
};

// One progress report from a worker (append-heavy: written in batches).
// One page of a list, by id (keyset): the records with an id above after_id, at most limit of them, in id order. The
// default is the whole list.
struct IdPage {
  int64_t after_id = 0;
  int64_t limit = std::numeric_limits<int64_t>::max();
  // Datasets, models and jobs: only this project's; workers: this project's own ones and every managed one. Unset:
  // all. (Users and keys belong to no project: ignored.)
  std::optional<int64_t> project_id;
};

// A person (or a service account) who signs in with API keys. User 1, "admin", is the installation's first
// platform_admin: the admin key (GetAdminKeyHash) is its key.
struct User {
  int64_t id = 0;
  std::string name;  // unique
  bool platform_admin = false;
  int64_t created_at_ms = 0;
};

// A user's API key: only its sha256 is stored. Expired (expires_at_ms passed) or revoked keys are refused.
struct ApiKey {
  int64_t id = 0;
  int64_t user_id = 0;
  std::string name;  // what the user called it ("laptop", "ci")
  std::string key_sha256;
  int64_t created_at_ms = 0;
  std::optional<int64_t> expires_at_ms;
  std::optional<int64_t> revoked_at_ms;
};

// One record of the audit log (coordinator/audit_chain.h): `record_json` is the record whole, as it was hashed and
// as it is exported; the other fields copy some of its members, for filtering.
// Datasets, models, jobs and own workers belong to a project; project 1, "default", holds everything made before
// projects existed (and what a request naming no project makes).
struct Project {
  int64_t id = 0;
  std::string name;  // unique
  int64_t created_at_ms = 0;

  friend bool operator==(const Project&, const Project&) = default;
};

struct ProjectMember {
  int64_t project_id = 0;
  int64_t user_id = 0;
  ProjectRole role = ProjectRole::kViewer;

  friend bool operator==(const ProjectMember&, const ProjectMember&) = default;
};

struct AuditRecord {
  int64_t seq = 0;  // 1, 2, ...: the chain's order
  int64_t time_ms = 0;
  std::string actor;
  std::string action;
  std::string outcome;
  std::string record_json;
  int64_t project_id = 0;  // the project the request acted in; 0: none (users, keys, sign-ins, the managed pool)
};

// Which audit records ListAuditRecords returns: those matching every filter that is set, with after_seq < seq and
// (when before_seq is set) seq < before_seq, by seq ascending (newest_first: descending), at most `limit`.
struct AuditQuery {
  std::string actor;       // "": any
  std::string action;      // "": any
  std::string outcome;     // "": any
  int64_t project_id = 0;  // 0: any
  int64_t since_ms = 0;    // time_ms >= since_ms
  int64_t until_ms = 0;    // 0: no bound; else time_ms < until_ms
  int64_t after_seq = 0;
  int64_t before_seq = 0;  // 0: no bound
  bool newest_first = false;
  int64_t limit = 100;
};

// Which of a job's events ListJobEvents returns: all (type empty), those of `type`, or (exclude_type) all others.
struct JobEventFilter {
  std::string type;
  bool exclude_type = false;
};

struct MetricPoint {
  int64_t job_id = 0;
  int32_t round = 0;
  int64_t worker_id = 0;
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<double> throughput;   // training samples per second
  std::optional<double> utilization;  // accelerator utilisation, 0..1
  int64_t time_ms = 0;

  friend bool operator==(const MetricPoint&, const MetricPoint&) = default;
};

// A stored metric point with its id: ids increase in the order points are stored and page the job's series.
struct StoredMetricPoint {
  int64_t id = 0;
  MetricPoint point;

  friend bool operator==(const StoredMetricPoint&, const StoredMetricPoint&) = default;
};

// A state change as the events stream (SSE) shows it; ids increase across all jobs and serve as Last-Event-ID.
struct JobEvent {
  int64_t id = 0;  // assigned by AppendJobEvent
  int64_t job_id = 0;
  std::string type;          // e.g. "job_status", "round_started", "round_committed", "worker_progress"
  std::string payload_json;  // a JSON object
  int64_t time_ms = 0;

  friend bool operator==(const JobEvent&, const JobEvent&) = default;
};

// Writes of ApplyBatch, each as its single call would make it (AssignShard, AddRoundParticipant).
struct ShardAssignment {
  int64_t job_id = 0;
  int32_t shard_index = 0;
  int64_t worker_id = 0;

  friend bool operator==(const ShardAssignment&, const ShardAssignment&) = default;
};
struct RoundParticipant {
  int64_t job_id = 0;
  int32_t round = 0;
  int32_t attempt = 0;
  int64_t worker_id = 0;

  friend bool operator==(const RoundParticipant&, const RoundParticipant&) = default;
};
// One write of a batch: an event (AppendJobEvent; its id is ignored), an update (RecordUpdate), a shard assignment
// (AssignShard) or a late round participant (AddRoundParticipant).
using BatchWrite = std::variant<JobEvent, RoundUpdate, ShardAssignment, RoundParticipant>;
// "write 3 of 8 in a batch" (index 2 of 8): the context of a batch write's error.
std::string BatchWriteName(size_t index, size_t count);

// The coordinator lease (failover, docs/operations.md "Failover"): which of the coordinators sharing one store is the
// leader, and its fencing epoch.
struct LeaderLease {
  bool held = false;       // the caller holds it (until the lease's expiry, unless renewed)
  int64_t epoch = 0;       // the fencing token: one more on every change of holder
  std::string holder;      // the holder's id ("" when nobody ever held it)
  std::string holder_url;  // the holder's public URL, for standbys to name
};

// One schema step of a database-backed store (SQLite, PostgreSQL). `version` is 1 for the first and increases by one
// per step.
struct Migration {
  int version = 0;
  std::string_view sql;  // one or more statements
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // Datasets. CreateDataset: AlreadyExists if the blob key is taken. DeleteDataset: FailedPrecondition while a job
  // refers to it.
  virtual StatusOr<Dataset> CreateDataset(const Dataset& dataset) = 0;
  virtual StatusOr<Dataset> GetDataset(int64_t id) = 0;
  virtual StatusOr<std::vector<Dataset>> ListDatasets(const IdPage& page = {}) = 0;  // by id
  virtual Status DeleteDataset(int64_t id) = 0;

  // Models, with their files. DeleteModel: FailedPrecondition while a job refers to it.
  virtual StatusOr<Model> CreateModel(const Model& model) = 0;
  virtual StatusOr<Model> GetModel(int64_t id) = 0;
  virtual StatusOr<std::vector<Model>> ListModels(const IdPage& page = {}) = 0;  // by id
  virtual Status DeleteModel(int64_t id) = 0;

  // Workers. CreateWorker: AlreadyExists if the token hash is taken. UpdateWorker replaces name, device, status,
  // last_heartbeat_at_ms, revoked and trainers_json (kind, token hash and created_at stay). FindWorkerByTokenHash:
  // NotFound if no worker has it (revoked workers are returned: the caller checks `revoked`).
  virtual StatusOr<Worker> CreateWorker(const Worker& worker) = 0;
  virtual StatusOr<Worker> GetWorker(int64_t id) = 0;
  virtual StatusOr<Worker> FindWorkerByTokenHash(std::string_view token_sha256) = 0;
  virtual StatusOr<std::vector<Worker>> ListWorkers(const IdPage& page = {}) = 0;  // by id
  virtual Status UpdateWorker(const Worker& worker) = 0;
  // Sets last_heartbeat_at_ms of many workers in one commit (ids not found are skipped). The coordinator keeps
  // presence in memory and writes it in such batches: N heartbeats cost one commit, not N. The default runs one
  // UpdateWorker per worker; stores override it with one transaction.
  virtual Status RecordWorkersSeen(std::span<const WorkerSeen> seen);

  // The admin API key's hash (one per installation). Get: NotFound before the first Set. Set replaces it.
  virtual Status SetAdminKeyHash(std::string_view key_sha256) = 0;
  virtual StatusOr<std::string> GetAdminKeyHash() = 0;

  // Training jobs. CreateJob stores `job` as queued with rounds at 0 (its status and round fields are ignored);
  // NotFound if its dataset or model does not exist.
  virtual StatusOr<TrainingJob> CreateJob(const TrainingJob& job) = 0;
  virtual StatusOr<TrainingJob> GetJob(int64_t id) = 0;
  // All jobs by id, or only those with `status` (e.g. kRunning, to resume after a restart).
  virtual StatusOr<std::vector<TrainingJob>> ListJobs(std::optional<JobStatus> status = std::nullopt,
                                                      const IdPage& page = {}) = 0;
  // Moves a job to `status` and returns it. Entering kRunning sets started_at_ms (first time only); entering a
  // terminal status sets finished_at_ms and status_reason = `reason` (and, for kFailed, failure_reason = `reason`).
  // FailedPrecondition if the job is already terminal ("training job 7 is already cancelled") or `status` is kQueued.
  virtual StatusOr<TrainingJob> SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                             std::string_view reason = {}) = 0;

  // Artifacts. AddJobArtifact: AlreadyExists if the job already has one with that name.
  virtual Status AddJobArtifact(const JobArtifact& artifact) = 0;
  virtual StatusOr<std::vector<JobArtifact>> ListJobArtifacts(int64_t job_id) = 0;  // by name

  // Shards, all of a job's at once (their job_id fields are ignored). CreateShards: NotFound if the job does not
  // exist; AlreadyExists if it already has shards; InvalidArgument if there are none, the indices are not 0..n-1 or
  // a worker holds two. AssignShard: NotFound for an unknown shard or worker; FailedPrecondition if the shard
  // belongs to another worker or the worker already holds another shard of the job; assigning a worker its own
  // shard again is OK.
  virtual Status CreateShards(int64_t job_id, std::span<const Shard> shards) = 0;
  virtual StatusOr<std::vector<Shard>> ListShards(int64_t job_id) = 0;  // by index
  virtual Status AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) = 0;

  // Rounds. StartRound inserts `round` as running and sets the job's current_round, in one transaction.
  // FailedPrecondition unless the job is running, `round.round` == committed_round + 1, no attempt of that round is
  // still running, and the attempt is one more than the last attempt of that round (1 for the first).
  virtual Status StartRound(const Round& round) = 0;
  // Marks the round committed with its global and figures, sets the job's committed_round and current_round to it
  // and consecutive_failed_rounds to 0, and records previous_global_validation_loss (see RoundCommit), in one
  // transaction. NotFound if the attempt does not exist;
  // FailedPrecondition if it is not running or the job is not running; InvalidArgument if the global's key or
  // sha256 is empty.
  virtual Status CommitRound(const RoundCommit& commit) = 0;
  // The final evaluation's loss of the global of `round`, which must be the job's committed_round (>= 1): sets that
  // round's validation_loss and the job's final_validation_loss (and best_round if lower), in one transaction.
  // NotFound for an unknown job; FailedPrecondition if `round` is not the committed round or the job has ended.
  virtual Status RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) = 0;
  // Marks the round failed, increments the job's consecutive_failed_rounds (if counts_toward_fault_tolerance) and,
  // with fail_job_reason, fails the job, in one transaction. On a job that is already terminal (cancelled while the
  // round ran) only the round is marked. NotFound if the attempt does not exist; FailedPrecondition if it is not
  // running; InvalidArgument if `reason` is empty.
  virtual Status FailRound(const RoundFailure& failure) = 0;
  virtual StatusOr<Round> GetRound(int64_t job_id, int32_t round, int32_t attempt) = 0;
  virtual StatusOr<std::vector<Round>> ListRounds(int64_t job_id) = 0;  // by round, then attempt
  // Adds a worker given a task of the attempt after it started (a late joiner) to its participants; a worker already
  // listed is left as it is. NotFound if the attempt or the worker does not exist.
  virtual Status AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) = 0;

  // Updates. RecordUpdate: AlreadyExists if the worker already has an update for that round attempt (the caller
  // treats a duplicate result as idempotent); NotFound if the round attempt does not exist.
  virtual Status RecordUpdate(const RoundUpdate& update) = 0;
  virtual StatusOr<std::vector<RoundUpdate>> ListUpdates(int64_t job_id, int32_t round, int32_t attempt) = 0;

  // Metrics, appended in one transaction per batch. List: by time, then worker and step; optionally one worker's.
  virtual Status AppendMetrics(std::span<const MetricPoint> points) = 0;
  virtual StatusOr<std::vector<MetricPoint>> ListMetrics(int64_t job_id,
                                                         std::optional<int64_t> worker_id = std::nullopt) = 0;
  // One page of a job's points (every worker's): those with id > after_id, in the order stored, at most `limit`.
  virtual StatusOr<std::vector<StoredMetricPoint>> ListMetricsPage(int64_t job_id, int64_t after_id, int limit) = 0;
  // How many points the job holds from one worker.
  virtual StatusOr<int64_t> CountMetrics(int64_t job_id, int64_t worker_id) = 0;

  // Events for the SSE stream. Append returns the new event's id. List returns the job's events with id > after_id
  // that `filter` lets through, oldest first, at most `limit`. An index on (job, type, id) makes reading one type
  // (the warnings) direct, however many events of other types the job has.
  virtual StatusOr<int64_t> AppendJobEvent(const JobEvent& event) = 0;
  virtual StatusOr<std::vector<JobEvent>> ListJobEvents(int64_t job_id, int64_t after_id, int limit = 1000,
                                                        const JobEventFilter& filter = {}) = 0;
  // The id of the job's latest event; 0 when it has none.
  virtual StatusOr<int64_t> LastJobEventId(int64_t job_id) = 0;

  // Applies `writes` in order in ONE transaction (one commit, one fsync): all of them or, when one fails, none, with
  // that write's error (the single call's, e.g. AlreadyExists for a second update of a worker) prefixed by its
  // position ("write 3 of 8: ..."). Returns the ids of the batch's events, in the order they were given. Each write
  // checks what its single call checks (and, on a fenced store, the batch checks the lease once in its
  // transaction). The coordinator uses it for group commit: the writes of many workers share one commit.
  virtual StatusOr<std::vector<int64_t>> ApplyBatch(std::span<const BatchWrite> writes) = 0;

  // Users and their API keys. CreateUser: AlreadyExists when the name is taken. CreateApiKey: NotFound for an unknown
  // user, AlreadyExists for a hash already stored. ListApiKeys: every key, or one user's, by id. RevokeApiKey sets
  // revoked_at_ms (a key revoked before keeps its time); NotFound for an unknown key.
  virtual StatusOr<User> CreateUser(const User& user) = 0;
  // Sets a user's platform_admin (single sign-on reads it from the provider's claims at each sign-in). NotFound.
  virtual StatusOr<User> SetUserPlatformAdmin(int64_t id, bool platform_admin) = 0;
  virtual StatusOr<User> GetUser(int64_t id) = 0;
  virtual StatusOr<std::vector<User>> ListUsers(const IdPage& page = {}) = 0;
  virtual StatusOr<ApiKey> CreateApiKey(const ApiKey& key) = 0;
  virtual StatusOr<std::vector<ApiKey>> ListApiKeys(std::optional<int64_t> user_id = std::nullopt,
                                                    const IdPage& page = {}) = 0;
  virtual StatusOr<ApiKey> RevokeApiKey(int64_t key_id, int64_t time_ms) = 0;

  // Projects and their members. CreateProject: AlreadyExists when the name is taken. SetProjectMember adds the user
  // or changes their role; NotFound for an unknown project or user. SetProjectMember (a lower role) and
  // RemoveProjectMember refuse with FailedPrecondition to leave a project that has owners without one; Remove:
  // NotFound when the user is not a member. Checked in the write's transaction, so two concurrent removals cannot
  // both pass.
  virtual StatusOr<Project> CreateProject(const Project& project) = 0;
  virtual StatusOr<std::vector<Project>> ListProjects() = 0;  // by id
  virtual Status SetProjectMember(const ProjectMember& member) = 0;
  virtual Status RemoveProjectMember(int64_t project_id, int64_t user_id) = 0;
  virtual StatusOr<std::vector<ProjectMember>> ListProjectMembers() = 0;  // by project, then user

  // The audit log. Append stores `records` in one transaction (all or none): AlreadyExists when a seq is taken (a
  // coordinator whose view of the chain's head is stale), FailedPrecondition ("fenced") on a store that lost the lease.
  virtual Status AppendAuditRecords(std::span<const AuditRecord> records) = 0;
  virtual StatusOr<std::vector<AuditRecord>> ListAuditRecords(const AuditQuery& query) = 0;

  // Leader election among coordinators sharing the store. Only a store that several coordinators can share
  // (PostgreSQL) says true; the defaults (SQLite: one server, always the leader) grant every call the lease at epoch 1
  // and fence nothing.
  virtual bool SharedByCoordinators() const { return false; }
  // Takes the lease for `holder` (unique per process run) for `ttl` if nobody holds it, it expired, or `holder` already
  // holds it (a renewal, same epoch); otherwise returns the current holder with held = false. Expiry is by the
  // database's clock, so coordinators' clocks do not matter. From the first call on, every write of this store (jobs,
  // rounds, updates, artifacts, datasets, models, workers, metrics, events, the admin key hash) checks in its own
  // transaction that the lease's epoch is the one this store last acquired, and fails with FailedPrecondition
  // ("fenced: ...") on a standby or once another coordinator took over. Writes before the first call (a
  // coordinator's start-up: the admin key on first start) are not fenced.
  virtual StatusOr<LeaderLease> AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                                   std::chrono::milliseconds ttl);
  // Ends the lease now if `holder` holds it (a graceful shutdown: a standby takes over without waiting for expiry).
  virtual Status ReleaseLeaderLease(std::string_view holder);
};

// Calls `visit` with each of the job's events of type `type`, oldest first, page by page (through the store's index by
// type). The store's first error.
Status ForEachJobEventOfType(MetadataStore& store, int64_t job_id, std::string_view type,
                             const std::function<void(const JobEvent&)>& visit);

// Opens a store by URI: "sqlite:///abs/path.db", "sqlite://rel/path.db", a plain path, or ":memory:" opens a SQLite
// store (creating the file and applying migrations); "postgres://USER:PASSWORD@HOST:PORT/DATABASE" (or postgresql://)
// a PostgreSQL one (applying migrations). Other schemes are InvalidArgument naming what is supported.
StatusOr<std::unique_ptr<MetadataStore>> OpenMetadataStore(std::string_view uri);

}  // namespace parsyn::storage
