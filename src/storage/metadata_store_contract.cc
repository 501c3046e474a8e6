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

// ---- users and API keys

TEST_P(MetadataStoreContractTest, TheAdminIsTheFirstUserAndNamesAreUnique) {
  const std::vector<User> users = Must(store().ListUsers());
  ASSERT_EQ(users.size(), 1u);
  EXPECT_EQ(users[0].id, 1);
  EXPECT_EQ(users[0].name, "admin");
  EXPECT_TRUE(users[0].platform_admin);
  const User alice = Must(store().CreateUser(User{.name = "alice", .created_at_ms = kT0}));
  EXPECT_GT(alice.id, 1);
  EXPECT_FALSE(Must(store().GetUser(alice.id)).platform_admin);
  EXPECT_EQ(Must(store().GetUser(alice.id)).created_at_ms, kT0);
  EXPECT_EQ(store().CreateUser(User{.name = "alice"}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store().GetUser(999).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Must(store().ListUsers({.after_id = 1})).size(), 1u);
  EXPECT_TRUE(Must(store().SetUserPlatformAdmin(alice.id, true)).platform_admin);
  EXPECT_TRUE(Must(store().GetUser(alice.id)).platform_admin);
  EXPECT_FALSE(Must(store().SetUserPlatformAdmin(alice.id, false)).platform_admin);
  EXPECT_EQ(store().SetUserPlatformAdmin(999, true).status().code(), StatusCode::kNotFound);
}

TEST_P(MetadataStoreContractTest, ApiKeysAreStoredByHashListedPerUserAndRevokedOnce) {
  const User alice = Must(store().CreateUser(User{.name = "alice"}));
  const ApiKey laptop = Must(store().CreateApiKey(ApiKey{
      .user_id = alice.id, .name = "laptop", .key_sha256 = "h1", .created_at_ms = kT0, .expires_at_ms = kT0 + 5}));
  const ApiKey admin_ci = Must(store().CreateApiKey(ApiKey{.user_id = 1, .name = "ci", .key_sha256 = "h2"}));
  EXPECT_EQ(store().CreateApiKey(ApiKey{.user_id = alice.id, .key_sha256 = "h1"}).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(store().CreateApiKey(ApiKey{.user_id = 999, .key_sha256 = "h3"}).status().code(), StatusCode::kNotFound);
  const std::vector<ApiKey> mine = Must(store().ListApiKeys(alice.id));
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].name, "laptop");
  EXPECT_EQ(mine[0].key_sha256, "h1");
  EXPECT_EQ(mine[0].expires_at_ms, kT0 + 5);
  EXPECT_FALSE(mine[0].revoked_at_ms.has_value());
  EXPECT_EQ(Must(store().ListApiKeys()).size(), 2u);
  EXPECT_EQ(Must(store().RevokeApiKey(laptop.id, kT0 + 1)).revoked_at_ms, kT0 + 1);
  EXPECT_EQ(Must(store().RevokeApiKey(laptop.id, kT0 + 2)).revoked_at_ms, kT0 + 1);  // revoked once
  EXPECT_FALSE(Must(store().ListApiKeys(1)).at(0).revoked_at_ms.has_value());
  EXPECT_EQ(Must(store().ListApiKeys(1)).at(0).id, admin_ci.id);
  EXPECT_EQ(store().RevokeApiKey(999, kT0).status().code(), StatusCode::kNotFound);
}

// ---- projects

TEST_P(MetadataStoreContractTest, EverythingStartsInTheDefaultProjectAndListsFilterByProject) {
  EXPECT_THAT(Must(store().ListProjects()), ElementsAre(Project{.id = kDefaultProjectId, .name = "default"}));
  const Project team = Must(store().CreateProject(Project{.name = "team-a", .created_at_ms = kT0}));
  EXPECT_EQ(store().CreateProject(Project{.name = "team-a"}).status().code(), StatusCode::kAlreadyExists);
  const Dataset in_default = AddDataset("datasets/default");
  EXPECT_EQ(in_default.project_id, kDefaultProjectId);
  Dataset d{.name = "d", .blob_key = "datasets/team", .project_id = team.id};
  const Dataset in_team = Must(store().CreateDataset(d));
  EXPECT_EQ(Must(store().GetDataset(in_team.id)).project_id, team.id);
  EXPECT_THAT(Must(store().ListDatasets({.project_id = team.id})), ElementsAre(in_team));
  EXPECT_THAT(Must(store().ListDatasets({.project_id = kDefaultProjectId})), ElementsAre(in_default));
  EXPECT_EQ(Must(store().ListDatasets()).size(), 2u);

  const Model m_default = AddModel();
  Model m{.name = "m", .model_type = "llama", .config_json = "{}", .project_id = team.id};
  const Model m_team = Must(store().CreateModel(m));
  EXPECT_EQ(Must(store().ListModels({.project_id = team.id})).at(0).id, m_team.id);
  EXPECT_EQ(Must(store().ListModels({.project_id = team.id})).size(), 1u);

  // A job's dataset and model must be its project's: another project's are as unknown as missing ones.
  TrainingJob j{.name = "j", .dataset_id = in_default.id, .model_id = m_team.id, .project_id = team.id};
  EXPECT_EQ(store().CreateJob(j).status(), NotFoundError("dataset " + std::to_string(in_default.id) + " not found"));
  j.dataset_id = in_team.id;
  j.model_id = m_default.id;
  EXPECT_EQ(store().CreateJob(j).status(), NotFoundError("model " + std::to_string(m_default.id) + " not found"));
  j.model_id = m_team.id;
  const TrainingJob job = Must(store().CreateJob(j));
  EXPECT_EQ(Must(store().GetJob(job.id)).project_id, team.id);
  EXPECT_THAT(Must(store().ListJobs(std::nullopt, {.project_id = team.id})), ElementsAre(job));
  EXPECT_THAT(Must(store().ListJobs(JobStatus::kQueued, {.project_id = kDefaultProjectId})), IsEmpty());

  // Workers: a project lists its own ones and every managed one.
  const Worker own_default = AddWorker("own-default");
  const Worker own_team =
      Must(store().CreateWorker(Worker{.name = "own-team", .token_sha256 = "t1", .project_id = team.id}));
  const Worker managed =
      Must(store().CreateWorker(Worker{.name = "pool", .kind = WorkerKind::kManaged, .token_sha256 = "t2"}));
  EXPECT_THAT(Must(store().ListWorkers({.project_id = team.id})), ElementsAre(own_team, managed));
  EXPECT_THAT(Must(store().ListWorkers({.project_id = kDefaultProjectId})), ElementsAre(own_default, managed));
}

TEST_P(MetadataStoreContractTest, ProjectMembersKeepAnOwner) {
  const Project team = Must(store().CreateProject(Project{.name = "team-a"}));
  const User alice = Must(store().CreateUser(User{.name = "alice"}));
  const User bob = Must(store().CreateUser(User{.name = "bob"}));
  ASSERT_TRUE(store().SetProjectMember({.project_id = team.id, .user_id = alice.id, .role = ProjectRole::kOwner}).ok());
  ASSERT_TRUE(store().SetProjectMember({.project_id = team.id, .user_id = bob.id, .role = ProjectRole::kViewer}).ok());
  EXPECT_THAT(Must(store().ListProjectMembers()), ElementsAre(ProjectMember{team.id, alice.id, ProjectRole::kOwner},
                                                              ProjectMember{team.id, bob.id, ProjectRole::kViewer}));
  // The last owner can neither leave nor step down; once bob owns it too, alice can.
  EXPECT_EQ(store().RemoveProjectMember(team.id, alice.id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store().SetProjectMember({team.id, alice.id, ProjectRole::kEditor}).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Must(store().ListProjectMembers()).at(0).role, ProjectRole::kOwner);  // unchanged
  ASSERT_TRUE(store().SetProjectMember({team.id, bob.id, ProjectRole::kOwner}).ok());
  ASSERT_TRUE(store().RemoveProjectMember(team.id, alice.id).ok());
  EXPECT_THAT(Must(store().ListProjectMembers()), ElementsAre(ProjectMember{team.id, bob.id, ProjectRole::kOwner}));
  EXPECT_EQ(store().RemoveProjectMember(team.id, alice.id).code(), StatusCode::kNotFound);
  EXPECT_EQ(store().SetProjectMember({999, bob.id, ProjectRole::kViewer}).code(), StatusCode::kNotFound);
  EXPECT_EQ(store().SetProjectMember({team.id, 999, ProjectRole::kViewer}).code(), StatusCode::kNotFound);
}

// ---- audit log

AuditRecord Audit(int64_t seq, int64_t time_ms, std::string actor, std::string action, std::string outcome,
                  int64_t project_id = 0) {
  return AuditRecord{seq, time_ms, actor, action, outcome, "{\"seq\":" + std::to_string(seq) + "}", project_id};
}

TEST_P(MetadataStoreContractTest, AuditRecordsAreListedBySeqWithTheirFilters) {
  const std::vector<AuditRecord> records = {
      Audit(1, kT0, "admin", "POST /api/v1/datasets", "success"),
      Audit(2, kT0 + 10, "anonymous", "GET /api/v1/models", "denied"),
      Audit(3, kT0 + 20, "worker 4", "POST /api/v1/worker/result", "success", kDefaultProjectId),
      Audit(4, kT0 + 30, "admin", "POST /api/v1/datasets", "failure", 2),
  };
  ASSERT_OK(store().AppendAuditRecords(records));
  auto seqs = [&](AuditQuery q) {
    std::vector<int64_t> out;
    for (const AuditRecord& r : Must(store().ListAuditRecords(q))) out.push_back(r.seq);
    return out;
  };
  EXPECT_EQ(seqs({}), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(seqs({.newest_first = true, .limit = 2}), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(seqs({.before_seq = 3, .newest_first = true}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(seqs({.after_seq = 1, .limit = 2}), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(seqs({.actor = "admin"}), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(seqs({.action = "POST /api/v1/datasets", .outcome = "failure"}), (std::vector<int64_t>{4}));
  EXPECT_EQ(seqs({.outcome = "denied"}), (std::vector<int64_t>{2}));
  EXPECT_EQ(seqs({.project_id = 2}), (std::vector<int64_t>{4}));
  EXPECT_EQ(seqs({.since_ms = kT0 + 10, .until_ms = kT0 + 30}), (std::vector<int64_t>{2, 3}));
  const AuditRecord got = Must(store().ListAuditRecords({.after_seq = 2, .limit = 1})).at(0);
  EXPECT_EQ(got.time_ms, kT0 + 20);
  EXPECT_EQ(got.actor, "worker 4");
  EXPECT_EQ(got.action, "POST /api/v1/worker/result");
  EXPECT_EQ(got.outcome, "success");
  EXPECT_EQ(got.record_json, "{\"seq\":3}");
  EXPECT_EQ(got.project_id, kDefaultProjectId);
}

TEST_P(MetadataStoreContractTest, AnAuditBatchWithATakenSeqStoresNothing) {
  ASSERT_OK(store().AppendAuditRecords(std::vector<AuditRecord>{Audit(1, kT0, "admin", "a", "success")}));
  const std::vector<AuditRecord> batch = {Audit(2, kT0, "admin", "b", "success"), Audit(1, kT0, "x", "c", "success")};
  EXPECT_EQ(store().AppendAuditRecords(batch).code(), StatusCode::kAlreadyExists);
  const std::vector<AuditRecord> kept = Must(store().ListAuditRecords({}));
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].action, "a");
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
