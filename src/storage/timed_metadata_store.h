// TimedMetadataStore: wraps a MetadataStore and records each call's latency in a histogram labelled by operation
// (the method's name in snake case: "commit_round", "list_jobs"), and each failed call in a counter. Whatever store
// the server runs on (SQLite today, others later), its latencies come out the same way on /metrics.
// Thread-safe if the wrapped store is.
#pragma once

#include <chrono>
#include <memory>
#include <type_traits>

#include "base/metrics.h"
#include "storage/metadata_store.h"

namespace parsyn::storage {

class TimedMetadataStore final : public MetadataStore {
 public:
  TimedMetadataStore(std::unique_ptr<MetadataStore> inner, metrics::HistogramFamily& latency,
                     metrics::CounterFamily& errors)
      : owned_(std::move(inner)), inner_(*owned_), latency_(latency), errors_(errors) {}

  MetadataStore& inner() { return inner_; }

  StatusOr<Dataset> CreateDataset(const Dataset& dataset) override {
    return Timed("create_dataset", [&] { return inner_.CreateDataset(dataset); });
  }
  StatusOr<Dataset> GetDataset(int64_t id) override {
    return Timed("get_dataset", [&] { return inner_.GetDataset(id); });
  }
  StatusOr<std::vector<Dataset>> ListDatasets(const IdPage& page) override {
    return Timed("list_datasets", [&] { return inner_.ListDatasets(page); });
  }
  Status DeleteDataset(int64_t id) override {
    return Timed("delete_dataset", [&] { return inner_.DeleteDataset(id); });
  }
  StatusOr<Model> CreateModel(const Model& model) override {
    return Timed("create_model", [&] { return inner_.CreateModel(model); });
  }
  StatusOr<Model> GetModel(int64_t id) override {
    return Timed("get_model", [&] { return inner_.GetModel(id); });
  }
  StatusOr<std::vector<Model>> ListModels(const IdPage& page) override {
    return Timed("list_models", [&] { return inner_.ListModels(page); });
  }
  Status DeleteModel(int64_t id) override {
    return Timed("delete_model", [&] { return inner_.DeleteModel(id); });
  }
  StatusOr<Worker> CreateWorker(const Worker& worker) override {
    return Timed("create_worker", [&] { return inner_.CreateWorker(worker); });
  }
  StatusOr<Worker> GetWorker(int64_t id) override {
    return Timed("get_worker", [&] { return inner_.GetWorker(id); });
  }
  StatusOr<Worker> FindWorkerByTokenHash(std::string_view token_sha256) override {
    return Timed("find_worker_by_token_hash", [&] { return inner_.FindWorkerByTokenHash(token_sha256); });
  }
  StatusOr<std::vector<Worker>> ListWorkers(const IdPage& page) override {
    return Timed("list_workers", [&] { return inner_.ListWorkers(page); });
  }
  Status UpdateWorker(const Worker& worker) override {
    return Timed("update_worker", [&] { return inner_.UpdateWorker(worker); });
  }
  Status RecordWorkersSeen(std::span<const WorkerSeen> seen) override {
    return Timed("record_workers_seen", [&] { return inner_.RecordWorkersSeen(seen); });
  }
  Status SetAdminKeyHash(std::string_view key_sha256) override {
    return Timed("set_admin_key_hash", [&] { return inner_.SetAdminKeyHash(key_sha256); });
  }
  StatusOr<std::string> GetAdminKeyHash() override {
    return Timed("get_admin_key_hash", [&] { return inner_.GetAdminKeyHash(); });
  }
  StatusOr<TrainingJob> CreateJob(const TrainingJob& job) override {
    return Timed("create_job", [&] { return inner_.CreateJob(job); });
  }
  StatusOr<TrainingJob> GetJob(int64_t id) override {
    return Timed("get_job", [&] { return inner_.GetJob(id); });
  }
  StatusOr<std::vector<TrainingJob>> ListJobs(std::optional<JobStatus> status, const IdPage& page) override {
    return Timed("list_jobs", [&] { return inner_.ListJobs(status, page); });
  }
  StatusOr<TrainingJob> SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                     std::string_view reason) override {
    return Timed("set_job_status", [&] { return inner_.SetJobStatus(job_id, status, time_ms, reason); });
  }
  Status AddJobArtifact(const JobArtifact& artifact) override {
    return Timed("add_job_artifact", [&] { return inner_.AddJobArtifact(artifact); });
  }
  StatusOr<std::vector<JobArtifact>> ListJobArtifacts(int64_t job_id) override {
    return Timed("list_job_artifacts", [&] { return inner_.ListJobArtifacts(job_id); });
  }
  Status CreateShards(int64_t job_id, std::span<const Shard> shards) override {
    return Timed("create_shards", [&] { return inner_.CreateShards(job_id, shards); });
  }
  StatusOr<std::vector<Shard>> ListShards(int64_t job_id) override {
    return Timed("list_shards", [&] { return inner_.ListShards(job_id); });
  }
  Status AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) override {
    return Timed("assign_shard", [&] { return inner_.AssignShard(job_id, shard_index, worker_id); });
  }
  Status StartRound(const Round& round) override {
    return Timed("start_round", [&] { return inner_.StartRound(round); });
  }
  Status CommitRound(const RoundCommit& commit) override {
    return Timed("commit_round", [&] { return inner_.CommitRound(commit); });
  }
  Status RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) override {
    return Timed("record_final_validation_loss",
                 [&] { return inner_.RecordFinalValidationLoss(job_id, round, validation_loss); });
  }
  Status FailRound(const RoundFailure& failure) override {
    return Timed("fail_round", [&] { return inner_.FailRound(failure); });
  }
  StatusOr<Round> GetRound(int64_t job_id, int32_t round, int32_t attempt) override {
    return Timed("get_round", [&] { return inner_.GetRound(job_id, round, attempt); });
  }
  StatusOr<std::vector<Round>> ListRounds(int64_t job_id) override {
    return Timed("list_rounds", [&] { return inner_.ListRounds(job_id); });
  }
  Status AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) override {
    return Timed("add_round_participant",
                 [&] { return inner_.AddRoundParticipant(job_id, round, attempt, worker_id); });
  }
  Status RecordUpdate(const RoundUpdate& update) override {
    return Timed("record_update", [&] { return inner_.RecordUpdate(update); });
  }
  StatusOr<std::vector<RoundUpdate>> ListUpdates(int64_t job_id, int32_t round, int32_t attempt) override {
    return Timed("list_updates", [&] { return inner_.ListUpdates(job_id, round, attempt); });
  }
  Status AppendMetrics(std::span<const MetricPoint> points) override {
    return Timed("append_metrics", [&] { return inner_.AppendMetrics(points); });
  }
  StatusOr<std::vector<MetricPoint>> ListMetrics(int64_t job_id, std::optional<int64_t> worker_id) override {
    return Timed("list_metrics", [&] { return inner_.ListMetrics(job_id, worker_id); });
  }
  StatusOr<std::vector<StoredMetricPoint>> ListMetricsPage(int64_t job_id, int64_t after_id, int limit) override {
    return Timed("list_metrics_page", [&] { return inner_.ListMetricsPage(job_id, after_id, limit); });
  }
  StatusOr<int64_t> CountMetrics(int64_t job_id, int64_t worker_id) override {
    return Timed("count_metrics", [&] { return inner_.CountMetrics(job_id, worker_id); });
  }
  StatusOr<int64_t> AppendJobEvent(const JobEvent& event) override {
    return Timed("append_job_event", [&] { return inner_.AppendJobEvent(event); });
  }
  StatusOr<std::vector<JobEvent>> ListJobEvents(int64_t job_id, int64_t after_id, int limit,
                                                const JobEventFilter& filter) override {
    return Timed("list_job_events", [&] { return inner_.ListJobEvents(job_id, after_id, limit, filter); });
  }
  StatusOr<int64_t> LastJobEventId(int64_t job_id) override {
    return Timed("last_job_event_id", [&] { return inner_.LastJobEventId(job_id); });
  }
  StatusOr<std::vector<int64_t>> ApplyBatch(std::span<const BatchWrite> writes) override {
    return Timed("apply_batch", [&] { return inner_.ApplyBatch(writes); });
  }
  StatusOr<User> CreateUser(const User& user) override {
    return Timed("create_user", [&] { return inner_.CreateUser(user); });
  }
  StatusOr<User> SetUserPlatformAdmin(int64_t id, bool platform_admin) override {
    return Timed("set_user_platform_admin", [&] { return inner_.SetUserPlatformAdmin(id, platform_admin); });
  }
  StatusOr<User> GetUser(int64_t id) override {
    return Timed("get_user", [&] { return inner_.GetUser(id); });
  }
  StatusOr<std::vector<User>> ListUsers(const IdPage& page = {}) override {
    return Timed("list_users", [&] { return inner_.ListUsers(page); });
  }
  StatusOr<ApiKey> CreateApiKey(const ApiKey& key) override {
    return Timed("create_api_key", [&] { return inner_.CreateApiKey(key); });
  }
  StatusOr<std::vector<ApiKey>> ListApiKeys(std::optional<int64_t> user_id = std::nullopt,
                                            const IdPage& page = {}) override {
    return Timed("list_api_keys", [&] { return inner_.ListApiKeys(user_id, page); });
  }
  StatusOr<ApiKey> RevokeApiKey(int64_t key_id, int64_t time_ms) override {
    return Timed("revoke_api_key", [&] { return inner_.RevokeApiKey(key_id, time_ms); });
  }
  StatusOr<Project> CreateProject(const Project& project) override {
    return Timed("create_project", [&] { return inner_.CreateProject(project); });
  }
  StatusOr<std::vector<Project>> ListProjects() override {
    return Timed("list_projects", [&] { return inner_.ListProjects(); });
  }
  Status SetProjectMember(const ProjectMember& member) override {
    return Timed("set_project_member", [&] { return inner_.SetProjectMember(member); });
  }
  Status RemoveProjectMember(int64_t project_id, int64_t user_id) override {
    return Timed("remove_project_member", [&] { return inner_.RemoveProjectMember(project_id, user_id); });
  }
  StatusOr<std::vector<ProjectMember>> ListProjectMembers() override {
    return Timed("list_project_members", [&] { return inner_.ListProjectMembers(); });
  }
  Status AppendAuditRecords(std::span<const AuditRecord> records) override {
    return Timed("append_audit_records", [&] { return inner_.AppendAuditRecords(records); });
  }
  StatusOr<std::vector<AuditRecord>> ListAuditRecords(const AuditQuery& query) override {
    return Timed("list_audit_records", [&] { return inner_.ListAuditRecords(query); });
  }

  bool SharedByCoordinators() const override { return inner_.SharedByCoordinators(); }
  StatusOr<LeaderLease> AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                           std::chrono::milliseconds ttl) override {
    return Timed("acquire_leader_lease", [&] { return inner_.AcquireLeaderLease(holder, holder_url, ttl); });
  }
  Status ReleaseLeaderLease(std::string_view holder) override {
    return Timed("release_leader_lease", [&] { return inner_.ReleaseLeaderLease(holder); });
  }

 private:
  template <typename Call>
  std::invoke_result_t<Call&> Timed(const char* operation, Call&& call) {
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    latency_.WithLabels({operation})
        .Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!result.ok()) errors_.WithLabels({operation}).Inc();
    return result;
  }

  std::unique_ptr<MetadataStore> owned_;
  MetadataStore& inner_;
  metrics::HistogramFamily& latency_;
  metrics::CounterFamily& errors_;
};

}  // namespace parsyn::storage
