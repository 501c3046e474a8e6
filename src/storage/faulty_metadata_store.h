// FaultyMetadataStore: wraps a MetadataStore and fails a chosen write, for tests of what callers do when the store
// refuses (the coordinator must not acknowledge a transition the store did not take).
//
// Reads always pass through. A failed write returns the injected Status without reaching the wrapped store, so the
// wrapped store keeps its prior state. Safe to call from several threads if the wrapped store is.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "storage/metadata_store.h"

namespace parsyn::storage {

class FaultyMetadataStore final : public MetadataStore {
 public:
  explicit FaultyMetadataStore(std::unique_ptr<MetadataStore> inner) : owned_(std::move(inner)), inner_(*owned_) {}

  // The wrapped store, for checking what reached it.
  MetadataStore& inner() { return inner_; }

  // The `n`th write from now (1: the next one) returns `error` (not OK); writes before and after it pass through.
  void FailNthWrite(int n, Status error) {
    std::lock_guard lock(mu_);
    writes_until_failure_ = n;
    error_ = std::move(error);
  }
  // The next `count` writes all return `error` (an outage); later writes pass through.
  void FailNextWrites(int count, Status error) {
    std::lock_guard lock(mu_);
    writes_failing_ = count;
    error_ = std::move(error);
  }
  // Writes from now on wait (on their caller's thread) until ReleaseWrites: a test sees what queues up behind a slow
  // commit. writes_held(): how many are waiting.
  void HoldWrites() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void ReleaseWrites() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    released_.notify_all();
  }
  int writes_held() const {
    std::lock_guard lock(mu_);
    return writes_held_;
  }
  // Writes that reached the wrapped store so far.
  int writes_passed() const {
    std::lock_guard lock(mu_);
    return writes_passed_;
  }

  StatusOr<Dataset> CreateDataset(const Dataset& d) override {
    return Write([&] { return inner_.CreateDataset(d); });
  }
  StatusOr<Dataset> GetDataset(int64_t id) override { return inner_.GetDataset(id); }
  StatusOr<std::vector<Dataset>> ListDatasets(const IdPage& page = {}) override { return inner_.ListDatasets(page); }
  Status DeleteDataset(int64_t id) override {
    return Write([&] { return inner_.DeleteDataset(id); });
  }

  StatusOr<Model> CreateModel(const Model& m) override {
    return Write([&] { return inner_.CreateModel(m); });
  }
  StatusOr<Model> GetModel(int64_t id) override { return inner_.GetModel(id); }
  StatusOr<std::vector<Model>> ListModels(const IdPage& page = {}) override { return inner_.ListModels(page); }
  Status DeleteModel(int64_t id) override {
    return Write([&] { return inner_.DeleteModel(id); });
  }

  StatusOr<Worker> CreateWorker(const Worker& w) override {
    return Write([&] { return inner_.CreateWorker(w); });
  }
  StatusOr<Worker> GetWorker(int64_t id) override { return inner_.GetWorker(id); }
  StatusOr<Worker> FindWorkerByTokenHash(std::string_view h) override { return inner_.FindWorkerByTokenHash(h); }
  StatusOr<std::vector<Worker>> ListWorkers(const IdPage& page = {}) override { return inner_.ListWorkers(page); }
  Status UpdateWorker(const Worker& w) override {
    return Write([&] { return inner_.UpdateWorker(w); });
  }
  Status RecordWorkersSeen(std::span<const WorkerSeen> seen) override {
    return Write([&] { return inner_.RecordWorkersSeen(seen); });
  }

  Status SetAdminKeyHash(std::string_view h) override {
    return Write([&] { return inner_.SetAdminKeyHash(h); });
  }
  StatusOr<std::string> GetAdminKeyHash() override { return inner_.GetAdminKeyHash(); }

  StatusOr<TrainingJob> CreateJob(const TrainingJob& j) override {
    return Write([&] { return inner_.CreateJob(j); });
  }
  StatusOr<TrainingJob> GetJob(int64_t id) override { return inner_.GetJob(id); }
  StatusOr<std::vector<TrainingJob>> ListJobs(std::optional<JobStatus> status = std::nullopt,
                                              const IdPage& page = {}) override {
    return inner_.ListJobs(status, page);
  }
  StatusOr<TrainingJob> SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                     std::string_view reason = {}) override {
    return Write([&] { return inner_.SetJobStatus(job_id, status, time_ms, reason); });
  }

  Status AddJobArtifact(const JobArtifact& a) override {
    return Write([&] { return inner_.AddJobArtifact(a); });
  }
  StatusOr<std::vector<JobArtifact>> ListJobArtifacts(int64_t job_id) override {
    return inner_.ListJobArtifacts(job_id);
  }

  Status CreateShards(int64_t job_id, std::span<const Shard> shards) override {
    return Write([&] { return inner_.CreateShards(job_id, shards); });
  }
  StatusOr<std::vector<Shard>> ListShards(int64_t job_id) override { return inner_.ListShards(job_id); }
  Status AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) override {
    return Write([&] { return inner_.AssignShard(job_id, shard_index, worker_id); });
  }

  Status StartRound(const Round& r) override {
    return Write([&] { return inner_.StartRound(r); });
  }
  Status CommitRound(const RoundCommit& c) override {
    return Write([&] { return inner_.CommitRound(c); });
  }
  Status RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) override {
    return Write([&] { return inner_.RecordFinalValidationLoss(job_id, round, validation_loss); });
  }
  Status FailRound(const RoundFailure& f) override {
    return Write([&] { return inner_.FailRound(f); });
  }
  StatusOr<Round> GetRound(int64_t job_id, int32_t round, int32_t attempt) override {
    return inner_.GetRound(job_id, round, attempt);
  }
  StatusOr<std::vector<Round>> ListRounds(int64_t job_id) override { return inner_.ListRounds(job_id); }
  Status AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) override {
    return Write([&] { return inner_.AddRoundParticipant(job_id, round, attempt, worker_id); });
  }

  Status RecordUpdate(const RoundUpdate& u) override {
    return Write([&] { return inner_.RecordUpdate(u); });
  }
  StatusOr<std::vector<RoundUpdate>> ListUpdates(int64_t job_id, int32_t round, int32_t attempt) override {
    return inner_.ListUpdates(job_id, round, attempt);
  }

  Status AppendMetrics(std::span<const MetricPoint> p) override {
    return Write([&] { return inner_.AppendMetrics(p); });
  }
  StatusOr<std::vector<MetricPoint>> ListMetrics(int64_t job_id,
                                                 std::optional<int64_t> worker_id = std::nullopt) override {
    return inner_.ListMetrics(job_id, worker_id);
  }
  StatusOr<std::vector<StoredMetricPoint>> ListMetricsPage(int64_t job_id, int64_t after_id, int limit) override {
    return inner_.ListMetricsPage(job_id, after_id, limit);
  }
  StatusOr<int64_t> CountMetrics(int64_t job_id, int64_t worker_id) override {
    return inner_.CountMetrics(job_id, worker_id);
  }

  StatusOr<int64_t> AppendJobEvent(const JobEvent& e) override {
    return Write([&] { return inner_.AppendJobEvent(e); });
  }
  StatusOr<std::vector<JobEvent>> ListJobEvents(int64_t job_id, int64_t after_id, int limit = 1000,
                                                const JobEventFilter& filter = {}) override {
    return inner_.ListJobEvents(job_id, after_id, limit, filter);
  }
  StatusOr<int64_t> LastJobEventId(int64_t job_id) override { return inner_.LastJobEventId(job_id); }
  // A batch is one write: it fails (or passes) whole.
  StatusOr<std::vector<int64_t>> ApplyBatch(std::span<const BatchWrite> writes) override {
    return Write([&] { return inner_.ApplyBatch(writes); });
  }
  StatusOr<User> CreateUser(const User& u) override {
    return Write([&] { return inner_.CreateUser(u); });
  }
  StatusOr<User> SetUserPlatformAdmin(int64_t id, bool platform_admin) override {
    return Write([&] { return inner_.SetUserPlatformAdmin(id, platform_admin); });
  }
  StatusOr<User> GetUser(int64_t id) override { return inner_.GetUser(id); }
  StatusOr<std::vector<User>> ListUsers(const IdPage& page = {}) override { return inner_.ListUsers(page); }
  StatusOr<ApiKey> CreateApiKey(const ApiKey& k) override {
    return Write([&] { return inner_.CreateApiKey(k); });
  }
  StatusOr<std::vector<ApiKey>> ListApiKeys(std::optional<int64_t> user_id = std::nullopt,
                                            const IdPage& page = {}) override {
    return inner_.ListApiKeys(user_id, page);
  }
  StatusOr<ApiKey> RevokeApiKey(int64_t key_id, int64_t time_ms) override {
    return Write([&] { return inner_.RevokeApiKey(key_id, time_ms); });
  }
  StatusOr<Project> CreateProject(const Project& p) override {
    return Write([&] { return inner_.CreateProject(p); });
  }
  StatusOr<std::vector<Project>> ListProjects() override { return inner_.ListProjects(); }
  Status SetProjectMember(const ProjectMember& m) override {
    return Write([&] { return inner_.SetProjectMember(m); });
  }
  Status RemoveProjectMember(int64_t project_id, int64_t user_id) override {
    return Write([&] { return inner_.RemoveProjectMember(project_id, user_id); });
  }
  StatusOr<std::vector<ProjectMember>> ListProjectMembers() override { return inner_.ListProjectMembers(); }
  Status AppendAuditRecords(std::span<const AuditRecord> records) override {
    return Write([&] { return inner_.AppendAuditRecords(records); });
  }
  StatusOr<std::vector<AuditRecord>> ListAuditRecords(const AuditQuery& query) override {
    return inner_.ListAuditRecords(query);
  }

 private:
  // Runs `write` unless this is the write chosen to fail.
  template <typename F>
  auto Write(F&& write) -> decltype(write()) {
    {
      std::unique_lock lock(mu_);
      writes_held_++;
      released_.wait(lock, [&] { return !held_; });
      writes_held_--;
      if (writes_failing_ > 0) {
        --writes_failing_;
        return error_;
      }
      if (writes_until_failure_ > 0 && --writes_until_failure_ == 0) return error_;
    }
    auto result = write();
    std::lock_guard lock(mu_);
    ++writes_passed_;
    return result;
  }

  std::unique_ptr<MetadataStore> owned_;
  MetadataStore& inner_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  bool held_ = false;
  int writes_held_ = 0;
  int writes_until_failure_ = 0;  // 0: no failure pending
  int writes_failing_ = 0;        // writes still to fail in an outage
  int writes_passed_ = 0;
  Status error_;
};

}  // namespace parsyn::storage
