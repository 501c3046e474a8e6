// SqlMetadataStore: the MetadataStore (metadata_store.h) on a SQL database, written once for SQLite and PostgreSQL:
// its queries, row mapping and transactions, over a SqlConnection (sql_connection.h) that supplies what differs.
// SqliteMetadataStore (sqlite_store.h) and PostgresMetadataStore (postgres_store.h) open it on their connections.
//
// Multi-record changes (CommitRound, StartRound, FailRound, ...) are one transaction each; those that read before
// they write lock the job's row first (SqlConnection::RowLock: FOR UPDATE on PostgreSQL, so two stores on one
// database serialise per job as SQLite's BEGIN IMMEDIATE serialises per file).
//
// Fencing: once a subclass has taken part in leader election (fencing_epoch_ != 0; only PostgreSQL's does), every
// write checks in its own transaction that the lease's epoch in `coordinator_lease` is still the one it acquired,
// and fails with FailedPrecondition ("fenced: ...") otherwise.
//
// Threads: one connection guarded by a mutex; every method may be called from any thread (calls are serialised).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "storage/metadata_store.h"
#include "storage/sql/sql_connection.h"

namespace parsyn::storage {

class SqlMetadataStore : public MetadataStore {
 public:
  ~SqlMetadataStore() override;

  // The version of the shared schema (sql_schema.h) the database has.
  StatusOr<int> SchemaVersion();
  // Transactions committed since Open (on SQLite each statement outside a transaction counts as one): tests check
  // that a hot path (heartbeats, a batch) costs O(1) commits, not one per record.
  int64_t commits() const { return db_->commits(); }

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

  StatusOr<User> CreateUser(const User& user) override;
  StatusOr<User> SetUserPlatformAdmin(int64_t id, bool platform_admin) override;
  StatusOr<User> GetUser(int64_t id) override;
  StatusOr<std::vector<User>> ListUsers(const IdPage& page = {}) override;
  StatusOr<ApiKey> CreateApiKey(const ApiKey& key) override;
  StatusOr<std::vector<ApiKey>> ListApiKeys(std::optional<int64_t> user_id = std::nullopt,
                                            const IdPage& page = {}) override;
  StatusOr<ApiKey> RevokeApiKey(int64_t key_id, int64_t time_ms) override;

  StatusOr<Project> CreateProject(const Project& project) override;
  StatusOr<std::vector<Project>> ListProjects() override;
  Status SetProjectMember(const ProjectMember& member) override;
  Status RemoveProjectMember(int64_t project_id, int64_t user_id) override;
  StatusOr<std::vector<ProjectMember>> ListProjectMembers() override;

  Status AppendAuditRecords(std::span<const AuditRecord> records) override;
  StatusOr<std::vector<AuditRecord>> ListAuditRecords(const AuditQuery& query) override;

 protected:
  // `db` has its schema migrated already.
  explicit SqlMetadataStore(std::unique_ptr<SqlConnection> db);

  std::mutex mu_;  // guards db_ and fencing_epoch_: a connection is not for concurrent use
  std::unique_ptr<SqlConnection> db_;
  // 0: never asked for the lease (no fencing); -1: asked, not the leader; else the epoch it holds.
  int64_t fencing_epoch_ = 0;

 private:
  // Helpers for callers that already hold mu_ (and usually a transaction).
  StatusOr<TrainingJob> LoadJobLocked(int64_t job_id, bool for_update = false);
  StatusOr<Round> LoadRoundLocked(int64_t job_id, int32_t round, int32_t attempt);
  // Sets the committed attempt of `round`'s validation_loss and, if lower than the job's best, best_round
  // (FailedPrecondition if the round has no committed attempt).
  Status SetRoundValidationLossLocked(const TrainingJob& job, int32_t round, double loss);
  Status LoadParticipantsLocked(std::vector<Round>& rounds);
  // Runs `sql` (a DELETE of row `id`): FailedPrecondition naming `what` while a training job refers to the row,
  // NotFound when there is none.
  Status DeleteUnlessUsedLocked(const char* sql, std::string_view what, int64_t id);
  // FailedPrecondition when the project has members but no owner.
  Status CheckProjectKeepsOwnerLocked(int64_t project_id);
  // The writes ApplyBatch takes, as their single calls make them, inside the caller's transaction (if any; the
  // caller checks the fence).
  Status AssignShardLocked(const ShardAssignment& assignment);
  Status AddRoundParticipantLocked(const RoundParticipant& participant);
  Status RecordUpdateLocked(const RoundUpdate& update);
  StatusOr<int64_t> AppendJobEventLocked(const JobEvent& event);
  // In a write's transaction: OK unless this store took part in leader election and the lease's epoch is no longer
  // the one it acquired (FailedPrecondition "fenced: ...").
  Status CheckFenceLocked();
  // For a single-statement write: begins `txn` and checks the fence if this store is fenced; otherwise leaves the
  // statement to commit on its own. End it with txn.CommitIfBegun().
  Status BeginFencedWriteLocked(SqlTransaction& txn);
};

}  // namespace parsyn::storage
