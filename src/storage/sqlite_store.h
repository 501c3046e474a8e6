// SqliteMetadataStore: the MetadataStore on one SQLite database file (or ":memory:").
//
// Settings at open: journal_mode=WAL, synchronous=FULL (every commit is fsynced: an acknowledged change survives
// power loss, not just a crash of this process), foreign_keys=ON, busy_timeout. The schema is versioned: the
// `schema_version` table holds the number of migrations applied, and Open() applies the missing ones in order, each
// in its own transaction together with its version bump, so a crash mid-migration leaves the previous version.
// Threads: one connection guarded by a mutex; every method may be called from any thread (calls are serialised).
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "storage/metadata_store.h"

namespace parsyn::storage {

// The schema this build uses, in order.
std::span<const Migration> SqliteMigrations();

class SqliteMetadataStore final : public MetadataStore {
 public:
  // Opens (creating if missing) the database at `path` (":memory:" for a private in-memory one) and applies
  // `migrations` that are not applied yet. FailedPrecondition if the database's schema is newer than the last of
  // `migrations` (written by a newer build); Unavailable if it cannot be opened; Internal naming the version if a
  // migration fails (nothing of it is kept). Tests may pass a prefix of SqliteMigrations() or their own list.
  static StatusOr<std::unique_ptr<SqliteMetadataStore>> Open(
      const std::string& path, std::span<const Migration> migrations = SqliteMigrations());
  ~SqliteMetadataStore() override;

  // The number of migrations applied to the open database.
  StatusOr<int> SchemaVersion();
  // Transactions committed since Open (each autocommit statement counts as one): tests check that a hot path
  // (heartbeats) costs O(1) commits, not one per call.
  int64_t commits() const { return commits_.load(std::memory_order_relaxed); }

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

  // The raw connection, for tests that install triggers or functions to inject faults. Not for production code.
  sqlite3* handle_for_testing() { return db_.get(); }

 private:
  struct DbCloser {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  class StatementCache;  // prepared statements by SQL text, prepared on first use and reused

  explicit SqliteMetadataStore(std::unique_ptr<sqlite3, DbCloser> db);

  // Helpers for callers that already hold mu_ (and usually a transaction).
  StatusOr<TrainingJob> LoadJobLocked(int64_t job_id);
  StatusOr<Round> LoadRoundLocked(int64_t job_id, int32_t round, int32_t attempt);
  // Sets the committed attempt of `round`'s validation_loss and, if lower than the job's best, best_round
  // (FailedPrecondition if the round has no committed attempt).
  Status SetRoundValidationLossLocked(const TrainingJob& job, int32_t round, double loss);
  Status LoadParticipantsLocked(std::vector<Round>& rounds);
  // The writes ApplyBatch takes, as their single calls make them, inside the caller's transaction (if any).
  Status AssignShardLocked(const ShardAssignment& assignment);
  Status AddRoundParticipantLocked(const RoundParticipant& participant);
  Status RecordUpdateLocked(const RoundUpdate& update);
  StatusOr<int64_t> AppendJobEventLocked(const JobEvent& event);
  // Runs `sql` (a DELETE of row `id`): FailedPrecondition naming `what` while a training job refers to the row,
  // NotFound when there is none.
  Status DeleteUnlessUsedLocked(const char* sql, std::string_view what, int64_t id);

  std::atomic<int64_t> commits_{0};
  std::mutex mu_;  // guards db_ and statements_: SQLite connections are not for concurrent use
  std::unique_ptr<sqlite3, DbCloser> db_;
  std::unique_ptr<StatementCache> statements_;
};

}  // namespace parsyn::storage
