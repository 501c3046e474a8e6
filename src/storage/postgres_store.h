// PostgresMetadataStore: the MetadataStore on a PostgreSQL database, through libpq.
//
// URL: postgres://USER:PASSWORD@HOST:PORT/DATABASE?PARAMS (or postgresql://), libpq's own URI form, so libpq's
// parameters (sslmode, connect_timeout, ...) and environment (PGPASSWORD, ~/.pgpass) apply. Errors name the host,
// port, database and user, never the password.
//
// Semantics are SQLite's (sqlite_store.h): the same typed records, errors and messages (the contract suite in
// metadata_store_contract.h runs against both). Multi-record changes (CommitRound, StartRound, FailRound, ...) are one
// transaction each; those that read before they write lock the job's row first (SELECT ... FOR UPDATE), so two
// stores on one database (two coordinators) serialise per job as SQLite's BEGIN IMMEDIATE serialises per file.
// Every statement is a prepared statement with $n parameters; rows are read one at a time (libpq's single-row
// mode), so a long list never sits whole in libpq's buffers as well as in the result. Durability is the server's
// (synchronous_commit=on by default: a commit returns after its WAL is flushed).
//
// Schema: versioned like SQLite's: the `schema_version` table holds the number of migrations applied, and Open()
// applies the missing ones in order, each in its own transaction with its version bump, under an advisory lock so
// two processes opening one database at once migrate it once. PostgreSQL's version 1 is the current schema (the
// SQLite versions 1-3 in one step); later changes are appended as new versions.
//
// Failover: the table coordinator_lease (schema version 3) holds the leader lease (AcquireLeaderLease); once a store
// has asked for it, its job writes check the lease's epoch in their own transaction (fencing), so a deposed leader's
// late writes are refused by the database (docs/architecture.md, "Failover").
//
// Threads: one connection guarded by a mutex; every method may be called from any thread (calls are serialised).
// A connection the server dropped is re-established at the next call (its error was Unavailable).
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "storage/metadata_store.h"

namespace parsyn::storage {

// The libpq connection with its prepared statements (postgres_store.cc).
class PostgresConnection;

// The PostgreSQL schema this build uses, in order.
std::span<const Migration> PostgresMigrations();

// Whether `uri` names a PostgreSQL database (postgres:// or postgresql://).
bool IsPostgresUri(std::string_view uri);

// `uri` with its passwords, if any (USER:PASSWORD@ and password= query values), replaced by "***": safe for logs
// and messages.
std::string RedactPostgresUri(std::string_view uri);

class PostgresMetadataStore final : public MetadataStore {
 public:
  // Connects to `uri` and applies `migrations` that are not applied yet. InvalidArgument for a malformed URL;
  // Unavailable naming host:port (never the password) if the server cannot be reached or refuses the login;
  // FailedPrecondition if the database's schema is newer than the last of `migrations`; Internal naming the version if
  // a migration fails (nothing of it is kept). Tests may pass a prefix of PostgresMigrations() or their own list.
  static StatusOr<std::unique_ptr<PostgresMetadataStore>> Open(
      std::string_view uri, std::span<const Migration> migrations = PostgresMigrations());
  ~PostgresMetadataStore() override;

  // The number of migrations applied to the database.
  StatusOr<int> SchemaVersion();
  // Transactions this store committed (BEGIN ... COMMIT) since Open: tests check that a batch is one.
  int64_t commits() const;

  StatusOr<Dataset> CreateDataset(const Dataset& dataset) override;
  StatusOr<Dataset> GetDataset(int64_t id) override;
  StatusOr<std::vector<Dataset>> ListDatasets(const IdPage& page = {}) override;
  Status DeleteDataset(int64_t id) override;

  StatusOr<Model> CreateModel(const Model& model) override;
  StatusOr<Model> GetModel(int64_t id) override;
  StatusOr<std::vector<Model>> ListModels(const IdPage& page = {}) override;
  Status DeleteModel(int64_t id) override;

  StatusOr<Worker> CreateWorker(const Worker& worker) override;
  StatusOr<Worker> GetWorker(int64_t id) override;
  StatusOr<Worker> FindWorkerByTokenHash(std::string_view token_sha256) override;
  StatusOr<std::vector<Worker>> ListWorkers(const IdPage& page = {}) override;
  Status UpdateWorker(const Worker& worker) override;
  Status RecordWorkersSeen(std::span<const WorkerSeen> seen) override;

  Status SetAdminKeyHash(std::string_view key_sha256) override;
  StatusOr<std::string> GetAdminKeyHash() override;

  StatusOr<TrainingJob> CreateJob(const TrainingJob& job) override;
  StatusOr<TrainingJob> GetJob(int64_t id) override;
  StatusOr<std::vector<TrainingJob>> ListJobs(std::optional<JobStatus> status = std::nullopt,
                                              const IdPage& page = {}) override;
  StatusOr<TrainingJob> SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                     std::string_view reason = {}) override;

  Status AddJobArtifact(const JobArtifact& artifact) override;
  StatusOr<std::vector<JobArtifact>> ListJobArtifacts(int64_t job_id) override;

  Status CreateShards(int64_t job_id, std::span<const Shard> shards) override;
  StatusOr<std::vector<Shard>> ListShards(int64_t job_id) override;
  Status AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) override;

  Status StartRound(const Round& round) override;
  Status CommitRound(const RoundCommit& commit) override;
  Status RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) override;
  Status FailRound(const RoundFailure& failure) override;
  StatusOr<Round> GetRound(int64_t job_id, int32_t round, int32_t attempt) override;
  Status AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) override;
  StatusOr<std::vector<Round>> ListRounds(int64_t job_id) override;

  Status RecordUpdate(const RoundUpdate& update) override;
  StatusOr<std::vector<RoundUpdate>> ListUpdates(int64_t job_id, int32_t round, int32_t attempt) override;

  Status AppendMetrics(std::span<const MetricPoint> points) override;
  StatusOr<std::vector<MetricPoint>> ListMetrics(int64_t job_id,
                                                 std::optional<int64_t> worker_id = std::nullopt) override;
  StatusOr<std::vector<StoredMetricPoint>> ListMetricsPage(int64_t job_id, int64_t after_id, int limit) override;
  StatusOr<int64_t> CountMetrics(int64_t job_id, int64_t worker_id) override;

  StatusOr<int64_t> AppendJobEvent(const JobEvent& event) override;
  StatusOr<std::vector<JobEvent>> ListJobEvents(int64_t job_id, int64_t after_id, int limit = 1000,
                                                const JobEventFilter& filter = {}) override;
  StatusOr<int64_t> LastJobEventId(int64_t job_id) override;

  StatusOr<std::vector<int64_t>> ApplyBatch(std::span<const BatchWrite> writes) override;

  // The lease is the row of `coordinator_lease` (schema version 3), with its expiry by the database's clock.
  bool SharedByCoordinators() const override { return true; }
  StatusOr<LeaderLease> AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                           std::chrono::milliseconds ttl) override;
  Status ReleaseLeaderLease(std::string_view holder) override;

 private:
  explicit PostgresMetadataStore(std::unique_ptr<PostgresConnection> db);

  // Helpers for callers that already hold mu_ (and usually a transaction).
  StatusOr<TrainingJob> LoadJobLocked(int64_t job_id, bool for_update = false);
  StatusOr<Round> LoadRoundLocked(int64_t job_id, int32_t round, int32_t attempt);
  Status SetRoundValidationLossLocked(const TrainingJob& job, int32_t round, double loss);
  Status LoadParticipantsLocked(std::vector<Round>& rounds);
  Status DeleteUnlessUsedLocked(const char* sql, std::string_view what, int64_t id);
  // The writes ApplyBatch takes, as their single calls make them, inside the caller's transaction (if any; the
  // caller checks the fence).
  Status AssignShardLocked(const ShardAssignment& assignment);
  Status AddRoundParticipantLocked(const RoundParticipant& participant);
  Status RecordUpdateLocked(const RoundUpdate& update);
  StatusOr<int64_t> AppendJobEventLocked(const JobEvent& event);
  // In a write's transaction: OK unless this store took part in leader election (fencing_epoch_ != 0) and the
  // lease's epoch is no longer the one it acquired (FailedPrecondition "fenced: ...").
  Status CheckFenceLocked();

  std::mutex mu_;  // guards db_: a libpq connection is not for concurrent use
  std::unique_ptr<PostgresConnection> db_;
  // Guarded by mu_. 0: never asked for the lease (no fencing); -1: asked, not the leader; else the epoch it holds.
  int64_t fencing_epoch_ = 0;
};

}  // namespace parsyn::storage
