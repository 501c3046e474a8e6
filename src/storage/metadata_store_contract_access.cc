// The metadata store contract (metadata_store_contract.h), its access records: users and their API keys, projects
// and their members, and the audit log.
#include <gmock/gmock.h>

#include "storage/metadata_store_contract.h"
#include "storage/metadata_store_contract_helpers.h"

namespace parsyn::storage {
namespace {

using namespace contract;  // metadata_store_contract_helpers.h
using ::testing::ElementsAre;
using ::testing::IsEmpty;

}  // namespace

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

}  // namespace parsyn::storage
