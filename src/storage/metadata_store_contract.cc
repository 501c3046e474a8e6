#include "storage/metadata_store_contract.h"
#include "base/testing/missing_dependency.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <stdexcept>

#include "storage/faulty_metadata_store.h"
#include "storage/postgres_store.h"
#include "storage/sqlite_store.h"
#include "storage/timed_metadata_store.h"

namespace parsyn::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kT0 = 1'700'000'000'000;

// Transactions the store under the wrappers has committed so far.
int64_t CommitsOf(MetadataStore& store) {
  if (auto* faulty = dynamic_cast<FaultyMetadataStore*>(&store)) return CommitsOf(faulty->inner());
  if (auto* timed = dynamic_cast<TimedMetadataStore*>(&store)) return CommitsOf(timed->inner());
  if (auto* sqlite = dynamic_cast<SqliteMetadataStore*>(&store)) return sqlite->commits();
  if (auto* postgres = dynamic_cast<PostgresMetadataStore*>(&store)) return postgres->commits();
  throw std::runtime_error("no commit count for this store");
}

#define ASSERT_OK(expr)                                                  \
  do {                                                                   \
    ::parsyn::Status assert_ok_status_ = (expr);                         \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_.ToString(); \
  } while (0)

// The value of a StatusOr that must be OK in this test.
template <typename T>
T Must(StatusOr<T> s) {
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) throw std::runtime_error(s.status().ToString());  // ends the test; gtest reports it
  return std::move(s).value();
}

Round NewRound(int64_t job_id, int32_t round, int32_t attempt, std::vector<int64_t> participants) {
  Round r;
  r.job_id = job_id;
  r.round = round;
  r.attempt = attempt;
  r.participants = std::move(participants);
  r.started_at_ms = kT0 + round * 1000 + attempt;
  return r;
}

RoundCommit NewCommit(int64_t job_id, int32_t round, int32_t attempt) {
  RoundCommit c;
  c.job_id = job_id;
  c.round = round;
  c.attempt = attempt;
  c.global_blob_key = "jobs/" + std::to_string(job_id) + "/rounds/" + std::to_string(round) + "/global.safetensors";
  c.global_sha256 = std::string(64, 'a' + static_cast<char>(round % 6));
  c.ended_at_ms = kT0 + round * 1000 + 500;
  c.train_loss = 2.5 - round * 0.25;
  c.previous_global_validation_loss = 2.75 - round * 0.25;
  c.bytes_down = 1000 * round;
  c.bytes_up = 300 * round;
  return c;
}

RoundFailure NewFailure(int64_t job_id, int32_t round, int32_t attempt) {
  RoundFailure f;
  f.job_id = job_id;
  f.round = round;
  f.attempt = attempt;
  f.reason = "1 of min_workers 2 reported within aggregation_timeout";
  f.ended_at_ms = kT0 + round * 1000 + 900;
  f.bytes_down = 7;
  f.bytes_up = 5;
  return f;
}

}  // namespace

std::string MetadataStoreBackendName(const ::testing::TestParamInfo<MetadataStoreBackend>& info) {
  return info.param.name;
}

void MetadataStoreContractTest::SetUp() {
  if (GetParam().unavailable) {
    if (std::optional<std::string> why = GetParam().unavailable()) {
      PARSYN_SKIP_FOR_MISSING_DEPENDENCY(GetParam().name + ": " + *why);
    }
  }
  StatusOr<std::unique_ptr<MetadataStore>> store = GetParam().open(scratch_.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  store_ = std::move(store).value();
}

void MetadataStoreContractTest::Reopen() {
  store_.reset();
  store_ = Must(GetParam().open(scratch_.path()));
}

Dataset MetadataStoreContractTest::AddDataset(std::string blob_key) {
  Dataset d;
  d.name = "alpaca-subset";
  d.format = DatasetFormat::kJsonl;
  d.kind = DatasetKind::kPromptCompletion;
  d.row_count = 1200;
  d.size_bytes = 345678;
  d.sha256 = std::string(64, 'd');
  d.blob_key = std::move(blob_key);
  d.created_at_ms = kT0;
  return Must(store().CreateDataset(d));
}

Model MetadataStoreContractTest::AddModel() {
  Model m;
  m.name = "tiny-llama";
  m.model_type = "llama";
  m.config_json = R"({"model_type":"llama","hidden_size":64})";
  m.files = {{"config.json", "models/1/config.json", 40, std::string(64, '1')},
             {"model.safetensors", "models/1/model.safetensors", 4096, std::string(64, '2')}};
  m.size_bytes = 4136;
  m.created_at_ms = kT0 + 1;
  return Must(store().CreateModel(m));
}

Worker MetadataStoreContractTest::AddWorker(std::string name) {
  Worker w;
  w.token_sha256 = std::string(64, 'f') + name;
  w.name = std::move(name);
  w.kind = WorkerKind::kOwn;
  w.created_at_ms = kT0 + 2;
  return Must(store().CreateWorker(w));
}

TrainingJob MetadataStoreContractTest::AddRunningJob(const Dataset& dataset, const Model& model) {
  TrainingJob j;
  j.name = "distributed-llama-finetune";
  j.dataset_id = dataset.id;
  j.model_id = model.id;
  j.spec_json = R"({"name":"distributed-llama-finetune"})";
  j.created_at_ms = kT0 + 3;
  TrainingJob created = Must(store().CreateJob(j));
  return Must(store().SetJobStatus(created.id, JobStatus::kRunning, kT0 + 4));
}

// ---- datasets

TEST_P(MetadataStoreContractTest, DatasetsRoundTripAndListInIdOrder) {
  Dataset a = AddDataset("datasets/a.jsonl");
  Dataset b = AddDataset("datasets/b.csv");
  EXPECT_GT(a.id, 0);
  EXPECT_GT(b.id, a.id);
  EXPECT_EQ(Must(store().GetDataset(a.id)), a);
  EXPECT_THAT(Must(store().ListDatasets()), ElementsAre(a, b));
}

TEST_P(MetadataStoreContractTest, DatasetErrorsNameTheId) {
  AddDataset("datasets/a.jsonl");
  Status missing = store().GetDataset(999).status();
  EXPECT_EQ(missing, NotFoundError("dataset 999 not found"));
  Dataset dup;
  dup.blob_key = "datasets/a.jsonl";
  Status taken = store().CreateDataset(dup).status();
  EXPECT_EQ(taken.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(taken.message(), HasSubstr("datasets/a.jsonl"));
  EXPECT_EQ(store().DeleteDataset(999), NotFoundError("dataset 999 not found"));
}

TEST_P(MetadataStoreContractTest, DatasetDeleteIsRefusedWhileAJobUsesIt) {
  Dataset used = AddDataset("datasets/used.jsonl");
  Dataset unused = AddDataset("datasets/unused.jsonl");
  AddRunningJob(used, AddModel());
  EXPECT_EQ(store().DeleteDataset(used.id),
            FailedPreconditionError("dataset " + std::to_string(used.id) + " is used by a training job"));
  ASSERT_OK(store().DeleteDataset(unused.id));
  EXPECT_EQ(store().GetDataset(unused.id).status().code(), StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListDatasets()), ElementsAre(used));
}

// ---- models

TEST_P(MetadataStoreContractTest, ModelsRoundTripWithTheirFiles) {
  Model m = AddModel();
  EXPECT_GT(m.id, 0);
  Model got = Must(store().GetModel(m.id));
  EXPECT_EQ(got, m);
  EXPECT_THAT(got.files, SizeIs(2));
  EXPECT_THAT(Must(store().ListModels()), ElementsAre(m));
  EXPECT_EQ(store().GetModel(m.id + 100).status(), NotFoundError("model " + std::to_string(m.id + 100) + " not found"));
}

TEST_P(MetadataStoreContractTest, ModelWithRepeatedFilePathIsInvalidAndNotStored) {
  Model m;
  m.name = "twice";
  m.files = {{"config.json", "models/x/a", 1, "h"}, {"config.json", "models/x/b", 1, "h"}};
  Status s = store().CreateModel(m).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'config.json'"));
  EXPECT_THAT(Must(store().ListModels()), IsEmpty());
}

TEST_P(MetadataStoreContractTest, ModelDeleteRemovesFilesAndIsRefusedWhileUsed) {
  Model used = AddModel();
  Model unused = AddModel();
  AddRunningJob(AddDataset(), used);
  EXPECT_EQ(store().DeleteModel(used.id).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(store().DeleteModel(unused.id));
  EXPECT_EQ(store().GetModel(unused.id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store().DeleteModel(unused.id).code(), StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListModels()), ElementsAre(used));
}

// ---- workers and the admin key

TEST_P(MetadataStoreContractTest, WorkersAreFoundByTokenHashAndUpdated) {
  Worker a = AddWorker("gpu-box-a");
  Worker b = AddWorker("gpu-box-b");
  EXPECT_EQ(Must(store().FindWorkerByTokenHash(b.token_sha256)), b);
  EXPECT_EQ(store().FindWorkerByTokenHash("unknown").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(a.last_heartbeat_at_ms.has_value());

  Worker changed = a;
  changed.name = "renamed";
  changed.device = "cuda:0 NVIDIA H200";
  changed.status = WorkerStatus::kBusy;
  changed.last_heartbeat_at_ms = kT0 + 99;
  changed.revoked = true;
  changed.trainers_json = R"([{"name":"builtin","describe":{}}])";
  changed.kind = WorkerKind::kManaged;  // not updatable
  changed.token_sha256 = "another";     // not updatable
  ASSERT_OK(store().UpdateWorker(changed));
  Worker got = Must(store().GetWorker(a.id));
  EXPECT_EQ(got.name, "renamed");
  EXPECT_EQ(got.device, "cuda:0 NVIDIA H200");
  EXPECT_EQ(got.status, WorkerStatus::kBusy);
  EXPECT_EQ(got.last_heartbeat_at_ms, kT0 + 99);
  EXPECT_TRUE(got.revoked);
  EXPECT_EQ(got.trainers_json, changed.trainers_json);
  EXPECT_EQ(got.kind, WorkerKind::kOwn);
  EXPECT_EQ(got.token_sha256, a.token_sha256);
  EXPECT_THAT(Must(store().ListWorkers()), ElementsAre(got, b));

  Worker ghost = a;
  ghost.id = 12345;
  EXPECT_EQ(store().UpdateWorker(ghost), NotFoundError("worker 12345 not found"));
}

TEST_P(MetadataStoreContractTest, WorkersSeenAreRecordedTogetherAndUnknownIdsSkipped) {
  Worker a = AddWorker("a");
  Worker b = AddWorker("b");
  Worker c = AddWorker("c");
  const std::vector<WorkerSeen> seen = {
      {.worker_id = a.id, .last_heartbeat_at_ms = kT0 + 1},
      {.worker_id = 12345, .last_heartbeat_at_ms = kT0 + 2},  // deleted meanwhile, say: skipped
      {.worker_id = c.id, .last_heartbeat_at_ms = kT0 + 3},
  };
  ASSERT_OK(store().RecordWorkersSeen(seen));
  ASSERT_OK(store().RecordWorkersSeen({}));
  EXPECT_EQ(Must(store().GetWorker(a.id)).last_heartbeat_at_ms, kT0 + 1);
  EXPECT_FALSE(Must(store().GetWorker(b.id)).last_heartbeat_at_ms.has_value());
  Worker got_c = Must(store().GetWorker(c.id));
  EXPECT_EQ(got_c.last_heartbeat_at_ms, kT0 + 3);
  EXPECT_EQ(got_c.status, c.status);  // only the time changes
  EXPECT_EQ(got_c.name, "c");
}

TEST_P(MetadataStoreContractTest, DuplicateTokenHashIsAlreadyExists) {
  Worker a = AddWorker("a");
  Worker dup;
  dup.name = "b";
  dup.token_sha256 = a.token_sha256;
  EXPECT_EQ(store().CreateWorker(dup).status().code(), StatusCode::kAlreadyExists);
}

TEST_P(MetadataStoreContractTest, AdminKeyHashIsSetAndReplaced) {
  EXPECT_EQ(store().GetAdminKeyHash().status().code(), StatusCode::kNotFound);
  ASSERT_OK(store().SetAdminKeyHash("hash-1"));
  EXPECT_EQ(Must(store().GetAdminKeyHash()), "hash-1");
  ASSERT_OK(store().SetAdminKeyHash("hash-2"));
  EXPECT_EQ(Must(store().GetAdminKeyHash()), "hash-2");
}

// ---- jobs

TEST_P(MetadataStoreContractTest, CreateJobStoresAQueuedJobAndChecksReferences) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob j;
  j.name = "job";
  j.dataset_id = d.id;
  j.model_id = m.id;
  j.spec_json = "{}";
  j.status = JobStatus::kSucceeded;  // ignored
  j.committed_round = 5;             // ignored
  j.created_at_ms = kT0;
  TrainingJob created = Must(store().CreateJob(j));
  EXPECT_GT(created.id, 0);
  EXPECT_EQ(created.status, JobStatus::kQueued);
  EXPECT_EQ(created.committed_round, 0);
  EXPECT_FALSE(created.started_at_ms.has_value());
  EXPECT_EQ(Must(store().GetJob(created.id)), created);

  j.dataset_id = 777;
  EXPECT_EQ(store().CreateJob(j).status(), NotFoundError("dataset 777 not found"));
  j.dataset_id = d.id;
  j.model_id = 778;
  EXPECT_EQ(store().CreateJob(j).status(), NotFoundError("model 778 not found"));
  EXPECT_EQ(store().GetJob(779).status(), NotFoundError("training job 779 not found"));
}

TEST_P(MetadataStoreContractTest, JobStatusTransitionsSetTimesAndStopAtTerminal) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  EXPECT_EQ(job.status, JobStatus::kRunning);
  EXPECT_EQ(job.started_at_ms, kT0 + 4);
  // Running again (e.g. after a restart) keeps the first start time.
  EXPECT_EQ(Must(store().SetJobStatus(job.id, JobStatus::kRunning, kT0 + 50)).started_at_ms, kT0 + 4);

  EXPECT_EQ(store().SetJobStatus(job.id, JobStatus::kQueued, kT0).status().code(), StatusCode::kFailedPrecondition);

  TrainingJob failed = Must(store().SetJobStatus(job.id, JobStatus::kFailed, kT0 + 60, "no workers"));
  EXPECT_EQ(failed.failure_reason, "no workers");
  EXPECT_EQ(failed.finished_at_ms, kT0 + 60);
  EXPECT_EQ(Must(store().GetJob(job.id)), failed);

  EXPECT_EQ(failed.status_reason, "no workers");
  StatusOr<TrainingJob> again = store().SetJobStatus(job.id, JobStatus::kCancelled, kT0 + 70);
  EXPECT_EQ(again.status(), FailedPreconditionError("training job " + std::to_string(job.id) + " is already failed"));
  EXPECT_EQ(store().SetJobStatus(4242, JobStatus::kRunning, kT0).status().code(), StatusCode::kNotFound);
}

TEST_P(MetadataStoreContractTest, ListJobsFiltersByStatus) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob running = AddRunningJob(d, m);
  TrainingJob stopped = AddRunningJob(d, m);
  stopped = Must(store().SetJobStatus(stopped.id, JobStatus::kStopped, kT0 + 9));
  TrainingJob also_running = AddRunningJob(d, m);
  EXPECT_THAT(Must(store().ListJobs()), ElementsAre(running, stopped, also_running));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kRunning)), ElementsAre(running, also_running));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kStopped)), ElementsAre(stopped));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kQueued)), IsEmpty());
}

// Lists page by id in the store (keyset): a page holds only its records, and a model its own files.
TEST_P(MetadataStoreContractTest, ListsReadOnePageById) {
  std::vector<Dataset> datasets;
  for (int i = 0; i < 5; ++i) datasets.push_back(AddDataset("datasets/" + std::to_string(i)));
  EXPECT_THAT(Must(store().ListDatasets({.after_id = datasets[1].id, .limit = 2})),
              ElementsAre(datasets[2], datasets[3]));
  EXPECT_THAT(Must(store().ListDatasets({.after_id = datasets[3].id, .limit = 2})), ElementsAre(datasets[4]));
  EXPECT_THAT(Must(store().ListDatasets({.after_id = datasets[4].id})), IsEmpty());

  std::vector<Model> models;
  for (int i = 0; i < 3; ++i) models.push_back(AddModel());
  EXPECT_THAT(Must(store().ListModels({.after_id = models[0].id, .limit = 1})), ElementsAre(models[1]));
  EXPECT_THAT(Must(store().ListModels({.after_id = models[1].id, .limit = 5})), ElementsAre(models[2]));

  std::vector<Worker> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(AddWorker("w" + std::to_string(i)));
  EXPECT_THAT(Must(store().ListWorkers({.after_id = workers[0].id, .limit = 2})), ElementsAre(workers[1], workers[2]));

  TrainingJob a = AddRunningJob(datasets[0], models[0]);
  TrainingJob b = AddRunningJob(datasets[0], models[0]);
  b = Must(store().SetJobStatus(b.id, JobStatus::kStopped, kT0 + 9));
  TrainingJob c = AddRunningJob(datasets[0], models[0]);
  TrainingJob d = AddRunningJob(datasets[0], models[0]);
  EXPECT_THAT(Must(store().ListJobs(std::nullopt, {.after_id = a.id, .limit = 2})), ElementsAre(b, c));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kRunning, {.after_id = a.id, .limit = 1})), ElementsAre(c));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kRunning, {.after_id = c.id, .limit = 5})), ElementsAre(d));
}

TEST_P(MetadataStoreContractTest, ArtifactsAreUniquePerJobName) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  JobArtifact a{job.id, "adapter_model.safetensors", "jobs/1/adapter_model.safetensors", 10, "s1", kT0};
  JobArtifact b{job.id, "adapter_config.json", "jobs/1/adapter_config.json", 2, "s2", kT0};
  ASSERT_OK(store().AddJobArtifact(a));
  ASSERT_OK(store().AddJobArtifact(b));
  EXPECT_THAT(Must(store().ListJobArtifacts(job.id)), ElementsAre(b, a));
  EXPECT_EQ(store().AddJobArtifact(a).code(), StatusCode::kAlreadyExists);
  JobArtifact orphan = a;
  orphan.job_id = 999;
  EXPECT_EQ(store().AddJobArtifact(orphan), NotFoundError("training job 999 not found"));
}

// ---- shards

TEST_P(MetadataStoreContractTest, ShardsAreWrittenOnceAndAssignedToOneWorkerEach) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  std::vector<Shard> shards = {{0, 1, std::nullopt, "jobs/1/shards/1", "s1", 90, 10},
                               {0, 0, w1.id, "jobs/1/shards/0", "s0", 91, 9, R"({"cat":90,"dog":1})"}};
  ASSERT_OK(store().CreateShards(job.id, shards));
  std::vector<Shard> listed = Must(store().ListShards(job.id));
  ASSERT_THAT(listed, SizeIs(2));
  EXPECT_EQ(listed[0].shard_index, 0);
  EXPECT_EQ(listed[0].worker_id, w1.id);
  EXPECT_EQ(listed[0].train_rows, 91);
  EXPECT_EQ(listed[0].job_id, job.id);
  EXPECT_EQ(listed[0].label_histogram_json, R"({"cat":90,"dog":1})");
  EXPECT_FALSE(listed[1].worker_id.has_value());
  EXPECT_EQ(listed[1].label_histogram_json, "");

  EXPECT_EQ(store().CreateShards(job.id, shards).code(), StatusCode::kAlreadyExists);

  // w1 already holds shard 0; shard 0 belongs to w1.
  EXPECT_EQ(store().AssignShard(job.id, 1, w1.id).code(), StatusCode::kFailedPrecondition);
  Status taken = store().AssignShard(job.id, 0, w2.id);
  EXPECT_EQ(taken.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(taken.message(), HasSubstr("belongs to worker " + std::to_string(w1.id)));
  ASSERT_OK(store().AssignShard(job.id, 0, w1.id));  // idempotent
  ASSERT_OK(store().AssignShard(job.id, 1, w2.id));
  EXPECT_EQ(Must(store().ListShards(job.id))[1].worker_id, w2.id);
  EXPECT_EQ(store().AssignShard(job.id, 7, w2.id).code(), StatusCode::kNotFound);
}

TEST_P(MetadataStoreContractTest, MalformedShardSetsAreInvalid) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w = AddWorker("w");
  EXPECT_EQ(store().CreateShards(job.id, {}).code(), StatusCode::kInvalidArgument);
  std::vector<Shard> gap = {{0, 0, std::nullopt, "k0", "s", 1, 0}, {0, 2, std::nullopt, "k2", "s", 1, 0}};
  EXPECT_EQ(store().CreateShards(job.id, gap).code(), StatusCode::kInvalidArgument);
  std::vector<Shard> twice = {{0, 0, w.id, "k0", "s", 1, 0}, {0, 1, w.id, "k1", "s", 1, 0}};
  EXPECT_EQ(store().CreateShards(job.id, twice).code(), StatusCode::kInvalidArgument);
  std::vector<Shard> ok = {{0, 0, std::nullopt, "k0", "s", 1, 0}};
  EXPECT_EQ(store().CreateShards(999, ok).code(), StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListShards(job.id)), IsEmpty());
}

// ---- rounds

TEST_P(MetadataStoreContractTest, RoundLifecycleStartCommitNext) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");

  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w2.id, w1.id})));
  TrainingJob during = Must(store().GetJob(job.id));
  EXPECT_EQ(during.current_round, 1);
  EXPECT_EQ(during.committed_round, 0);
  Round running = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(running.status, RoundStatus::kRunning);
  EXPECT_THAT(running.participants, ElementsAre(w1.id, w2.id));
  EXPECT_TRUE(running.global_blob_key.empty());

  RoundCommit commit = NewCommit(job.id, 1, 1);
  ASSERT_OK(store().CommitRound(commit));
  TrainingJob after = Must(store().GetJob(job.id));
  EXPECT_EQ(after.current_round, 1);
  EXPECT_EQ(after.committed_round, 1);
  Round committed = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(committed.status, RoundStatus::kCommitted);
  EXPECT_EQ(committed.global_blob_key, commit.global_blob_key);
  EXPECT_EQ(committed.global_sha256, commit.global_sha256);
  EXPECT_EQ(committed.ended_at_ms, commit.ended_at_ms);
  EXPECT_EQ(committed.train_loss, commit.train_loss);
  // Round 1's workers measured the starting weights: the job's initial loss; round 1's own global is not measured yet.
  EXPECT_EQ(committed.validation_loss, std::nullopt);
  EXPECT_EQ(after.initial_validation_loss, commit.previous_global_validation_loss);
  EXPECT_EQ(after.best_round, std::nullopt);
  EXPECT_EQ(committed.bytes_down, commit.bytes_down);
  EXPECT_EQ(committed.bytes_up, commit.bytes_up);
  EXPECT_EQ(committed.bytes_moved, commit.bytes_down + commit.bytes_up);

  Status twice = store().CommitRound(commit);
  EXPECT_EQ(twice, FailedPreconditionError("round 1 attempt 1 of training job " + std::to_string(job.id) +
                                           " is already committed"));
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {w1.id})));
  EXPECT_EQ(Must(store().GetJob(job.id)).current_round, 2);
  EXPECT_THAT(Must(store().ListRounds(job.id)), SizeIs(2));
}

// Each loss lands on the weights it measured: round r's commit carries global r-1's loss, the final evaluation the
// last global's; the job keeps the initial, final and lowest (best_round) figures.
TEST_P(MetadataStoreContractTest, ValidationLossesBelongToTheGlobalTheyMeasured) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  const std::vector<double> measured = {3.0, 2.0, 2.5, 2.0};  // the starting weights, then globals 1, 2, 3
  for (int32_t r = 1; r <= 3; ++r) {
    ASSERT_OK(store().StartRound(NewRound(job.id, r, 1, {})));
    if (r == 2) {  // a failed attempt records no loss
      ASSERT_OK(store().FailRound(NewFailure(job.id, r, 1)));
      ASSERT_OK(store().StartRound(NewRound(job.id, r, 2, {})));
    }
    RoundCommit commit = NewCommit(job.id, r, r == 2 ? 2 : 1);
    commit.previous_global_validation_loss = measured[r - 1];
    ASSERT_OK(store().CommitRound(commit));
    TrainingJob now = Must(store().GetJob(job.id));
    EXPECT_EQ(now.initial_validation_loss, 3.0);
    EXPECT_EQ(now.best_round, r == 1 ? std::nullopt : std::optional<int32_t>(1)) << "after round " << r;
  }
  TrainingJob running = Must(store().GetJob(job.id));
  EXPECT_EQ(running.best_validation_loss, 2.0);
  EXPECT_EQ(running.final_validation_loss, std::nullopt);

  // Only the committed round's global is the final one, and only once.
  EXPECT_EQ(store().RecordFinalValidationLoss(job.id, 2, 1.0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store().RecordFinalValidationLoss(4242, 3, 1.0).code(), StatusCode::kNotFound);
  ASSERT_OK(store().RecordFinalValidationLoss(job.id, 3, measured[3]));
  TrainingJob ended = Must(
      store().SetJobStatus(job.id, JobStatus::kSucceeded, kT0 + 90, "stopped early after round 3: no improvement"));
  EXPECT_EQ(ended.status_reason, "stopped early after round 3: no improvement");
  EXPECT_EQ(ended.failure_reason, "");
  EXPECT_EQ(ended.final_validation_loss, 2.0);
  EXPECT_EQ(ended.best_round, 1);  // round 3 ties with round 1: the earliest stays best
  EXPECT_EQ(ended.best_validation_loss, 2.0);
  EXPECT_EQ(store().RecordFinalValidationLoss(job.id, 3, 0.5).code(), StatusCode::kFailedPrecondition);

  std::vector<std::optional<double>> by_round;
  for (const Round& r : Must(store().ListRounds(job.id))) by_round.push_back(r.validation_loss);
  EXPECT_THAT(by_round, ElementsAre(2.0, std::nullopt, 2.5, 2.0));  // rounds 1, 2 (failed), 2, 3
}

TEST_P(MetadataStoreContractTest, ALowerLossMovesBestRound) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  for (int32_t r = 1; r <= 3; ++r) {
    ASSERT_OK(store().StartRound(NewRound(job.id, r, 1, {})));
    RoundCommit commit = NewCommit(job.id, r, 1);
    commit.previous_global_validation_loss = 4.0 - r;  // 3, then global 1: 2, global 2: 1
    ASSERT_OK(store().CommitRound(commit));
  }
  ASSERT_OK(store().RecordFinalValidationLoss(job.id, 3, 0.5));
  TrainingJob j = Must(store().GetJob(job.id));
  EXPECT_EQ(j.best_round, 3);
  EXPECT_EQ(j.best_validation_loss, 0.5);
  EXPECT_EQ(j.final_validation_loss, 0.5);
}

TEST_P(MetadataStoreContractTest, LateParticipantsJoinTheirAttemptOnly) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w1.id})));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 1, w2.id));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 1, w1.id));  // already listed: unchanged
  EXPECT_THAT(Must(store().GetRound(job.id, 1, 1)).participants, ElementsAre(w1.id, w2.id));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 2, {})));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 2, w2.id));
  std::vector<Round> rounds = Must(store().ListRounds(job.id));
  ASSERT_THAT(rounds, SizeIs(2));
  // The failed attempt's bytes as recorded; a running one has moved none yet.
  EXPECT_EQ(rounds[0].bytes_down, 7);
  EXPECT_EQ(rounds[0].bytes_up, 5);
  EXPECT_EQ(rounds[0].bytes_moved, 12);
  EXPECT_EQ(rounds[1].bytes_down, 0);
  EXPECT_EQ(rounds[1].bytes_up, 0);
  EXPECT_THAT(rounds[0].participants, ElementsAre(w1.id, w2.id));
  EXPECT_THAT(rounds[1].participants, ElementsAre(w2.id));
  EXPECT_EQ(store().AddRoundParticipant(job.id, 1, 3, w1.id).code(), StatusCode::kNotFound);
  EXPECT_EQ(store().AddRoundParticipant(job.id, 1, 2, 4040).code(), StatusCode::kNotFound);
}

struct StartCase {
  std::string what;
  int32_t round;
  int32_t attempt;
  std::string message_fragment;
};

// With round 1 committed and round 2 attempt 1 failed, which starts are allowed.
TEST_P(MetadataStoreContractTest, StartRoundRefusesSkipsRepeatsAndWrongAttempts) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  ASSERT_OK(store().CommitRound(NewCommit(job.id, 1, 1)));
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {})));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 2, 1)));

  const std::vector<StartCase> refused = {
      {"repeat a committed round", 1, 2, "the last committed round is 1, so the next is 2"},
      {"skip a round", 3, 1, "the last committed round is 1, so the next is 2"},
      {"reuse a failed attempt", 2, 1, "the next attempt is 2"},
      {"skip an attempt", 2, 3, "the next attempt is 2"},
  };
  for (const StartCase& c : refused) {
    Status s = store().StartRound(NewRound(job.id, c.round, c.attempt, {}));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << c.what;
    EXPECT_THAT(s.message(), HasSubstr(c.message_fragment)) << c.what;
  }
  EXPECT_EQ(store().StartRound(NewRound(job.id, 0, 1, {})).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 2, {})));
  Status overlapping = store().StartRound(NewRound(job.id, 2, 3, {}));
  EXPECT_EQ(overlapping.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(overlapping.message(), HasSubstr("attempt 2 is still running"));
}

TEST_P(MetadataStoreContractTest, StartRoundNeedsARunningJobAndKnownParticipants) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob queued;
  queued.name = "q";
  queued.dataset_id = d.id;
  queued.model_id = m.id;
  queued = Must(store().CreateJob(queued));
  Status s = store().StartRound(NewRound(queued.id, 1, 1, {}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("the job is queued"));
  EXPECT_EQ(store().StartRound(NewRound(999, 1, 1, {})).code(), StatusCode::kNotFound);

  TrainingJob job = AddRunningJob(d, m);
  Status unknown = store().StartRound(NewRound(job.id, 1, 1, {4040}));
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("worker 4040"));
  // Nothing of the refused start was kept.
  EXPECT_THAT(Must(store().ListRounds(job.id)), IsEmpty());
  EXPECT_EQ(Must(store().GetJob(job.id)).current_round, 0);
}

TEST_P(MetadataStoreContractTest, RefusedCommitLeavesThePriorState) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  RoundCommit no_key = NewCommit(job.id, 1, 1);
  no_key.global_blob_key.clear();
  EXPECT_EQ(store().CommitRound(no_key).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store().CommitRound(NewCommit(job.id, 1, 2)).code(), StatusCode::kNotFound);

  // A job cancelled while its round ran cannot commit that round.
  ASSERT_TRUE(store().SetJobStatus(job.id, JobStatus::kCancelled, kT0 + 5).ok());
  Status s = store().CommitRound(NewCommit(job.id, 1, 1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("the job is cancelled"));
  EXPECT_EQ(Must(store().GetRound(job.id, 1, 1)).status, RoundStatus::kRunning);
  EXPECT_EQ(Must(store().GetJob(job.id)).committed_round, 0);

  // It can still be closed as failed; the terminal job is left alone.
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  TrainingJob after = Must(store().GetJob(job.id));
  EXPECT_EQ(after.status, JobStatus::kCancelled);
  EXPECT_EQ(after.consecutive_failed_rounds, 0);
}

TEST_P(MetadataStoreContractTest, FailedRoundsCountUntilACommitAndCanFailTheJob) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 1);
  Round failed = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(failed.status, RoundStatus::kFailed);
  EXPECT_EQ(failed.failure_reason, NewFailure(job.id, 1, 1).reason);
  EXPECT_EQ(store().FailRound(NewFailure(job.id, 1, 1)).code(), StatusCode::kFailedPrecondition);

  // A round abandoned by a coordinator restart does not count.
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 2, {})));
  RoundFailure restart = NewFailure(job.id, 1, 2);
  restart.reason = "coordinator restarted";
  restart.counts_toward_fault_tolerance = false;
  ASSERT_OK(store().FailRound(restart));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 1);

  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 3, {})));
  ASSERT_OK(store().CommitRound(NewCommit(job.id, 1, 3)));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 0);

  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {})));
  RoundFailure last = NewFailure(job.id, 2, 1);
  last.fail_job_reason = "2 consecutive rounds failed (fault_tolerance 1): too few workers";
  ASSERT_OK(store().FailRound(last));
  TrainingJob dead = Must(store().GetJob(job.id));
  EXPECT_EQ(dead.status, JobStatus::kFailed);
  EXPECT_EQ(dead.failure_reason, *last.fail_job_reason);
  EXPECT_EQ(dead.status_reason, *last.fail_job_reason);
  EXPECT_EQ(dead.finished_at_ms, last.ended_at_ms);
  EXPECT_EQ(dead.consecutive_failed_rounds, 1);
  EXPECT_EQ(dead.committed_round, 1);

  RoundFailure no_reason = NewFailure(job.id, 2, 1);
  no_reason.reason.clear();
  EXPECT_EQ(store().FailRound(no_reason).code(), StatusCode::kInvalidArgument);

  std::vector<Round> rounds = Must(store().ListRounds(job.id));
  ASSERT_THAT(rounds, SizeIs(4));
  EXPECT_EQ(rounds[0].attempt, 1);
  EXPECT_EQ(rounds[2].status, RoundStatus::kCommitted);
  EXPECT_EQ(rounds[3].round, 2);
}

// ---- updates, metrics, events

TEST_P(MetadataStoreContractTest, OneUpdatePerWorkerPerRoundAttempt) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w1.id, w2.id})));
  RoundUpdate u1{job.id,
                 1,
                 1,
                 w1.id,
                 "jobs/1/rounds/1/w1",
                 "sha-1",
                 4096,
                 90,
                 1.25,
                 R"({"steps":10})",
                 UpdateStatus::kAccepted,
                 "",
                 kT0 + 10};
  RoundUpdate u2{job.id,
                 1,
                 1,
                 w2.id,
                 "jobs/1/rounds/1/w2",
                 "sha-2",
                 4096,
                 91,
                 std::nullopt,
                 "{}",
                 UpdateStatus::kRejected,
                 "tensor 'lora_A' has NaN at index 3",
                 kT0 + 11};
  ASSERT_OK(store().RecordUpdate(u2));
  ASSERT_OK(store().RecordUpdate(u1));
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), ElementsAre(u1, u2));

  Status dup = store().RecordUpdate(u1);
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.message(), HasSubstr("worker " + std::to_string(w1.id)));
  RoundUpdate wrong_round = u1;
  wrong_round.round = 2;
  EXPECT_EQ(store().RecordUpdate(wrong_round).code(), StatusCode::kNotFound);
  RoundUpdate ghost = u1;
  ghost.worker_id = 5050;
  EXPECT_EQ(store().RecordUpdate(ghost), NotFoundError("worker 5050 not found"));
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 2)), IsEmpty());
}

TEST_P(MetadataStoreContractTest, MetricsAppendInBatchesAndFilterByWorker) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  std::vector<MetricPoint> batch = {
      {job.id, 1, w2.id, 10, 2.0, 30.5, 0.9, kT0 + 20},
      {job.id, 1, w1.id, 10, 2.1, std::nullopt, std::nullopt, kT0 + 10},
      {job.id, 1, w1.id, 20, 1.9, 31.0, 0.8, kT0 + 30},
  };
  ASSERT_OK(store().AppendMetrics(batch));
  ASSERT_OK(store().AppendMetrics({}));
  EXPECT_THAT(Must(store().ListMetrics(job.id)), ElementsAre(batch[1], batch[0], batch[2]));
  EXPECT_THAT(Must(store().ListMetrics(job.id, w1.id)), ElementsAre(batch[1], batch[2]));

  // A batch with one bad point stores none of it.
  std::vector<MetricPoint> bad = {{job.id, 1, w1.id, 30, 1.8, 1, 1, kT0 + 40}, {job.id, 1, 6060, 30, 1, 1, 1, kT0}};
  EXPECT_EQ(store().AppendMetrics(bad).code(), StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListMetrics(job.id)), SizeIs(3));
}

TEST_P(MetadataStoreContractTest, MetricsPageInStoredOrderAndCountPerWorker) {
  Dataset dataset = AddDataset();
  Model model = AddModel();
  TrainingJob job = AddRunningJob(dataset, model);
  TrainingJob other = AddRunningJob(dataset, model);
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  std::vector<MetricPoint> batch = {
      {job.id, 1, w2.id, 10, 2.0, 30.5, 0.9, kT0 + 20},
      {other.id, 1, w1.id, 5, 3.0, std::nullopt, std::nullopt, kT0 + 15},
      {job.id, 1, w1.id, 10, 2.1, std::nullopt, std::nullopt, kT0 + 10},
      {job.id, 1, w1.id, 20, 1.9, 31.0, 0.8, kT0 + 30},
  };
  ASSERT_OK(store().AppendMetrics(batch));
  std::vector<StoredMetricPoint> all = Must(store().ListMetricsPage(job.id, 0, 10));
  ASSERT_THAT(all, SizeIs(3));  // the job's points only, in the order stored (not by time)
  EXPECT_EQ(all[0].point, batch[0]);
  EXPECT_EQ(all[1].point, batch[2]);
  EXPECT_EQ(all[2].point, batch[3]);
  EXPECT_LT(all[0].id, all[1].id);
  EXPECT_LT(all[1].id, all[2].id);
  // Paging: a limit, then the rest after the last id seen, then nothing.
  std::vector<StoredMetricPoint> first = Must(store().ListMetricsPage(job.id, 0, 2));
  EXPECT_THAT(first, ElementsAre(all[0], all[1]));
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, first.back().id, 2)), ElementsAre(all[2]));
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, all[2].id, 2)), IsEmpty());
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, 0, 0)), IsEmpty());

  EXPECT_EQ(Must(store().CountMetrics(job.id, w1.id)), 2);
  EXPECT_EQ(Must(store().CountMetrics(job.id, w2.id)), 1);
  EXPECT_EQ(Must(store().CountMetrics(other.id, w2.id)), 0);
}

TEST_P(MetadataStoreContractTest, EventsReplayAfterAnIdPerJob) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob a = AddRunningJob(d, m);
  TrainingJob b = AddRunningJob(d, m);
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(Must(store().AppendJobEvent(
        {0, i % 2 ? b.id : a.id, "round_started", R"({"round":)" + std::to_string(i) + "}", kT0 + i})));
  }
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());

  std::vector<JobEvent> all_a = Must(store().ListJobEvents(a.id, 0));
  ASSERT_THAT(all_a, SizeIs(3));
  EXPECT_EQ(all_a[0], (JobEvent{ids[0], a.id, "round_started", R"({"round":0})", kT0}));
  EXPECT_EQ(all_a[2].id, ids[4]);

  std::vector<JobEvent> after = Must(store().ListJobEvents(a.id, ids[0]));
  ASSERT_THAT(after, SizeIs(2));
  EXPECT_EQ(after[0].id, ids[2]);
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1)), SizeIs(1));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, ids[4])), IsEmpty());
  EXPECT_EQ(store().AppendJobEvent({0, 999, "x", "{}", kT0}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Must(store().LastJobEventId(a.id)), ids[4]);
  EXPECT_EQ(Must(store().LastJobEventId(b.id)), ids[3]);
  EXPECT_EQ(Must(store().LastJobEventId(999)), 0);

  // Filtered by type: only one type, or every other.
  const int64_t warning = Must(store().AppendJobEvent({0, a.id, "warning", R"({"message":"w"})", kT0 + 9}));
  std::vector<JobEvent> warnings = Must(store().ListJobEvents(a.id, 0, 1000, {.type = "warning"}));
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_EQ(warnings[0].id, warning);
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1000, {.type = "round_started", .exclude_type = true})),
              ElementsAre(Field(&JobEvent::id, warning)));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1000, {.type = "round_started"})), SizeIs(3));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, warning, 1000, {.type = "warning"})), IsEmpty());
}

// ---- batches

TEST_P(MetadataStoreContractTest, BatchAppliesEveryKindOfWriteInOrderInOneCommit) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  std::vector<Worker> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(AddWorker("w" + std::to_string(i)));
  std::vector<Shard> shards(3);
  for (int i = 0; i < 3; ++i) {
    shards[i].shard_index = i;
    shards[i].blob_key = "jobs/1/shards/" + std::to_string(i);
    shards[i].sha256 = std::string(64, 'c');
  }
  ASSERT_OK(store().CreateShards(job.id, shards));
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {workers[0].id})));

  std::vector<BatchWrite> writes;
  for (int i = 0; i < 3; ++i) {
    const int64_t w = workers[i].id;
    writes.push_back(ShardAssignment{job.id, i, w});
    if (i > 0) writes.push_back(RoundParticipant{job.id, 1, 1, w});
    writes.push_back(JobEvent{0, job.id, "task_assigned", R"({"worker_id":)" + std::to_string(w) + "}", kT0 + i});
    RoundUpdate u;
    u.job_id = job.id;
    u.round = u.attempt = 1;
    u.worker_id = w;
    u.blob_key = "jobs/1/rounds/1/w" + std::to_string(w);
    u.sha256 = std::string(64, 'd');
    u.metrics_json = "{}";
    u.received_at_ms = kT0 + 10 + i;
    writes.push_back(u);
    writes.push_back(JobEvent{0, job.id, "update_accepted", "{}", kT0 + 10 + i});
  }
  const int64_t commits_before = CommitsOf(store());
  std::vector<int64_t> ids = Must(store().ApplyBatch(writes));
  EXPECT_EQ(CommitsOf(store()) - commits_before, 1) << "a batch of " << writes.size() << " writes is one commit";

  std::vector<JobEvent> events = Must(store().ListJobEvents(job.id, 0));
  ASSERT_THAT(events, SizeIs(6));
  ASSERT_THAT(ids, SizeIs(6));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], events[i].id) << "event " << i;
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(events[0].type, "task_assigned");
  EXPECT_EQ(events[1].type, "update_accepted");
  std::vector<Shard> stored = Must(store().ListShards(job.id));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(stored[i].worker_id, workers[i].id);
  EXPECT_THAT(Must(store().GetRound(job.id, 1, 1)).participants,
              ElementsAre(workers[0].id, workers[1].id, workers[2].id));
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), SizeIs(3));
  EXPECT_THAT(Must(store().ApplyBatch({})), IsEmpty());
}

TEST_P(MetadataStoreContractTest, FailingWriteInABatchLeavesNothingOfIt) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w1.id, w2.id})));
  RoundUpdate u;
  u.job_id = job.id;
  u.round = u.attempt = 1;
  u.worker_id = w1.id;
  u.blob_key = "jobs/1/rounds/1/w1";
  u.sha256 = std::string(64, 'd');
  u.metrics_json = "{}";
  ASSERT_OK(store().RecordUpdate(u));

  RoundUpdate fresh = u;
  fresh.worker_id = w2.id;
  std::vector<BatchWrite> writes{JobEvent{0, job.id, "update_accepted", "{}", kT0}, fresh,
                                 u,  // a second update of w1: AlreadyExists, in the middle of the batch
                                 JobEvent{0, job.id, "update_accepted", "{}", kT0 + 1}};
  StatusOr<std::vector<int64_t>> applied = store().ApplyBatch(writes);
  EXPECT_EQ(applied.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(applied.status().message(), HasSubstr("write 3 of 4 in a batch"));
  EXPECT_THAT(applied.status().message(), HasSubstr("worker " + std::to_string(w1.id) + " already has an update"));
  EXPECT_THAT(Must(store().ListJobEvents(job.id, 0)), IsEmpty());
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), ElementsAre(u));

  // Other errors are the single calls' too: an unknown shard, a participant of an attempt that does not exist.
  EXPECT_EQ(store().ApplyBatch(std::vector<BatchWrite>{fresh, ShardAssignment{job.id, 7, w2.id}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(store().ApplyBatch(std::vector<BatchWrite>{fresh, RoundParticipant{job.id, 1, 9, w2.id}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), ElementsAre(u));
  ASSERT_OK(store().ApplyBatch(std::vector<BatchWrite>{fresh}).status());
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), SizeIs(2));
}

// ---- persistence

TEST_P(MetadataStoreContractTest, ReopenFindsEverything) {
  if (!GetParam().persistent) GTEST_SKIP() << GetParam().name << " keeps nothing across opens";
  Dataset d = AddDataset();
  Model m = AddModel();
  Worker w = AddWorker("w");
  TrainingJob job = AddRunningJob(d, m);
  ASSERT_OK(store().SetAdminKeyHash("admin-hash"));
  ASSERT_OK(store().CreateShards(job.id, std::vector<Shard>{{0, 0, w.id, "jobs/1/shards/0", "s", 9, 1}}));
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w.id})));
  RoundUpdate u{job.id, 1, 1, w.id, "k", "s", 1, 9, 1.0, "{}", UpdateStatus::kAccepted, "", kT0};
  ASSERT_OK(store().RecordUpdate(u));
  ASSERT_OK(store().CommitRound(NewCommit(job.id, 1, 1)));
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {w.id})));
  ASSERT_OK(store().AppendMetrics(std::vector<MetricPoint>{{job.id, 2, w.id, 5, 1.5, 2, 0.5, kT0 + 1}}));
  int64_t event_id = Must(store().AppendJobEvent({0, job.id, "round_started", "{}", kT0}));
  ASSERT_OK(store().AddJobArtifact({job.id, "global", "k", 1, "s", kT0}));
  TrainingJob job_before = Must(store().GetJob(job.id));
  std::vector<Round> rounds_before = Must(store().ListRounds(job.id));

  Reopen();

  EXPECT_EQ(Must(store().GetDataset(d.id)), d);
  EXPECT_EQ(Must(store().GetModel(m.id)), m);
  EXPECT_EQ(Must(store().GetWorker(w.id)), w);
  EXPECT_EQ(Must(store().GetAdminKeyHash()), "admin-hash");
  EXPECT_EQ(Must(store().GetJob(job.id)), job_before);
  EXPECT_EQ(job_before.committed_round, 1);
  EXPECT_EQ(job_before.current_round, 2);
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kRunning)), ElementsAre(job_before));
  EXPECT_EQ(Must(store().ListRounds(job.id)), rounds_before);
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), ElementsAre(u));
  EXPECT_THAT(Must(store().ListShards(job.id)), SizeIs(1));
  EXPECT_THAT(Must(store().ListMetrics(job.id)), SizeIs(1));
  EXPECT_THAT(Must(store().ListJobEvents(job.id, 0)),
              ElementsAre(JobEvent{event_id, job.id, "round_started", "{}", kT0}));
  EXPECT_THAT(Must(store().ListJobArtifacts(job.id)), SizeIs(1));
  // Ids keep increasing after a reopen: an SSE client's Last-Event-ID never points at a reused id.
  EXPECT_GT(Must(store().AppendJobEvent({0, job.id, "x", "{}", kT0})), event_id);
}

TEST_P(MetadataStoreContractTest, EnumNamesRoundTrip) {
  for (JobStatus s : {JobStatus::kQueued, JobStatus::kRunning, JobStatus::kSucceeded, JobStatus::kFailed,
                      JobStatus::kStopped, JobStatus::kCancelled}) {
    EXPECT_EQ(Must(ParseJobStatus(ToString(s))), s);
  }
  EXPECT_EQ(ToString(DatasetKind::kPromptCompletion), "prompt_completion");
  Status bad = ParseDatasetFormat("parquet").status();
  EXPECT_EQ(bad, InvalidArgumentError("unknown dataset format 'parquet'; expected one of jsonl, csv"));
  EXPECT_TRUE(IsTerminal(JobStatus::kStopped));
  EXPECT_FALSE(IsTerminal(JobStatus::kRunning));
}

}  // namespace parsyn::storage
