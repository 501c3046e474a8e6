#include "storage/metadata_store_contract.h"
#include "base/testing/missing_dependency.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <stdexcept>

#include "storage/metadata_store_contract_helpers.h"

namespace parsyn::storage {
namespace {

using namespace contract;  // metadata_store_contract_helpers.h
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

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
