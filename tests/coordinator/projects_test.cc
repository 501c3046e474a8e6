// Projects against a real `parsyn server`: each project's members see and act only on its objects (another project's
// answer 404, as ids that do not exist), a job takes only its project's dataset, model and own workers, members are
// managed by owners (the last owner stays, nobody raises their own role), owners read their project's audit records,
// and the CLI acts in the project its flag, environment or config file names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "harness.h"

namespace parsyn::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ProjectsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(dir_.path() / "data");
    admin_ = AdminClient(*server_);
  }
  json Post(http::Client& as, const std::string& path, const json& body) {
    StatusOr<http::ClientResponse> res = as.PostJson(path, body);
    EXPECT_TRUE(res.ok()) << path << ": " << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  }
  // A user of no project and a key of theirs.
  std::unique_ptr<http::Client> NewUser(const std::string& name) {
    const json user = Post(*admin_, "/api/v1/users", {{"name", name}});
    return ClientWithToken(*server_, Post(*admin_, "/api/v1/keys", {{"name", "k"}, {"user_id", user["id"]}})["key"]);
  }
  // A project owned by `owner`: its id.
  int64_t NewProject(const std::string& name, const std::string& owner) {
    return Post(*admin_, "/api/v1/projects", {{"name", name}, {"owner", owner}})["id"].get<int64_t>();
  }
  json AddMember(http::Client& as, int64_t project, const std::string& user, const std::string& role) {
    return Post(as, "/api/v1/projects/" + std::to_string(project) + "/members", {{"user", user}, {"role", role}});
  }
  // `parsyn ARGS` against the server: its exit code and its output (stdout and stderr).
  std::pair<int, std::string> Cli(std::vector<std::string> args,
                                  std::vector<std::pair<std::string, std::string>> environment = {}) {
    const std::filesystem::path out = dir_.path() / "cli.out";
    args.insert(args.end(), {"--server", server_->url()});
    StatusOr<Subprocess> cli = Subprocess::Start(
        test_support::BuildPath("parsyn"), args,
        {.output = SubprocessOptions::Output::kFile, .output_file = out, .environment = std::move(environment)});
    EXPECT_TRUE(cli.ok()) << cli.status().ToString();
    if (!cli.ok()) return {-1, ""};
    const int code = cli->Wait();
    std::ostringstream text;
    text << std::ifstream(out).rdbuf();
    return {code, text.str()};
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
};

TEST_F(ProjectsTest, MembersSeeOnlyTheirProjectsObjectsAndJobsTakeOnlyTheirProjects) {
  auto ana = NewUser("ana");
  auto ben = NewUser("ben");
  const int64_t vision = NewProject("vision", "ana");
  NewProject("speech", "ben");
  // ana's dataset, model and own worker, in vision.
  const Fixture f = [&] {
    http::Client in_vision({.base_url = server_->url(),
                            .bearer_token = server_->admin_key(),
                            .max_attempts = 1,
                            .headers = {{"X-Parsyn-Project", "vision"}}});
    return MakeFixture(in_vision, 8, 1);
  }();
  ASSERT_GT(f.dataset_id, 0);
  const std::string dataset = "/api/v1/datasets/" + std::to_string(f.dataset_id);
  EXPECT_EQ(StatusOf(ana->Get(dataset + "?project=speech")), 200);  // an object's project is its own
  EXPECT_EQ((*ana->Get("/api/v1/datasets?project=vision")->Json())["datasets"].size(), 1u);
  EXPECT_EQ((*admin_->Get("/api/v1/datasets")->Json())["datasets"].size(), 0u);  // the default project's: none
  // ben (speech) sees nothing of it: 404 as for ids that do not exist, and vision itself is unknown to him.
  StatusOr<http::ClientResponse> theirs = ben->Get(dataset);
  EXPECT_EQ(StatusOf(theirs), 404);
  EXPECT_THAT(theirs.status().message(), HasSubstr("dataset " + std::to_string(f.dataset_id) + " not found"));
  EXPECT_EQ(StatusOf(ben->Delete(dataset)), 404);
  EXPECT_EQ(StatusOf(ben->Get("/api/v1/workers/" + std::to_string(f.worker_ids[0]))), 404);
  StatusOr<http::ClientResponse> project = ben->Get("/api/v1/datasets?project=vision");
  EXPECT_EQ(StatusOf(project), 404);
  EXPECT_THAT(project.status().message(), HasSubstr("project 'vision' not found"));
  EXPECT_EQ((*ben->Get("/api/v1/datasets?project=speech")->Json())["datasets"].size(), 0u);
  EXPECT_EQ((*ben->Get("/api/v1/workers?project=speech")->Json())["workers"].size(), 0u);
  // A job in speech cannot take vision's dataset, model or worker: they "do not exist" there; nothing is created.
  json spec = DistributedSpec(f, 1, 1, 30);
  StatusOr<http::ClientResponse> job = ben->PostJson("/api/v1/training-jobs?project=speech", spec);
  ASSERT_EQ(StatusOf(job), 400);
  EXPECT_THAT(job.status().message(),
              HasSubstr("dataset_id: dataset " + std::to_string(f.dataset_id) + " does not exist"));
  EXPECT_THAT(job.status().message(), HasSubstr("model_id: model " + std::to_string(f.model_id) + " does not exist"));
  EXPECT_THAT(job.status().message(),
              HasSubstr("worker_selection.worker_ids: worker " + std::to_string(f.worker_ids[0]) + " does not exist"));
  EXPECT_EQ((*admin_->Get("/api/v1/training-jobs?project=speech")->Json())["training_jobs"].size(), 0u);
  // In vision it is a job of vision's, which its members see and others do not.
  const json created = Post(*ana, "/api/v1/training-jobs?project=vision", spec);
  ASSERT_TRUE(created.contains("id"));
  EXPECT_EQ(created["project_id"], vision);
  const std::string job_path = "/api/v1/training-jobs/" + created["id"].dump();
  EXPECT_EQ(StatusOf(ben->Get(job_path + "/rounds")), 404);
  EXPECT_EQ(StatusOf(ben->PostJson(job_path + "/cancel", json::object())), 404);
  // A viewer of vision reads it but cannot cancel it: 403 naming the role.
  auto vic = NewUser("vic");
  AddMember(*ana, vision, "vic", "viewer");
  EXPECT_EQ(StatusOf(vic->Get(job_path)), 200);
  StatusOr<http::ClientResponse> cancel = vic->PostJson(job_path + "/cancel", json::object());
  EXPECT_EQ(StatusOf(cancel), 403);
  EXPECT_THAT(cancel.status().message(), HasSubstr("needs the editor role in project vision; user vic is its viewer"));
  EXPECT_NE((*ana->Get(job_path)->Json())["status"], "cancelled");
  EXPECT_EQ(StatusOf(ana->PostJson(job_path + "/cancel", json::object())), 200);
}

TEST_F(ProjectsTest, OwnersManageMembersTheLastOwnerStaysAndOwnersReadTheirProjectsAuditRecords) {
  auto ana = NewUser("ana");
  auto ed = NewUser("ed");
  const int64_t vision = NewProject("vision", "ana");
  const std::string path = "/api/v1/projects/" + std::to_string(vision);
  AddMember(*ana, vision, "ed", "editor");
  // ed, an editor, cannot manage members, nor make himself owner.
  EXPECT_EQ(StatusOf(ed->PostJson(path + "/members", {{"user", "ed"}, {"role", "owner"}})), 403);
  // The last owner can neither step down nor leave; once ed owns it too, she can.
  StatusOr<http::ClientResponse> down = ana->PostJson(path + "/members", {{"user", "ana"}, {"role", "viewer"}});
  EXPECT_EQ(StatusOf(down), 409);
  EXPECT_THAT(down.status().message(), HasSubstr("ana is the last owner of project vision"));
  EXPECT_EQ(StatusOf(ana->Delete(path + "/membership")), 409);
  EXPECT_EQ((*ana->Get(path)->Json())["role"], "owner");
  AddMember(*ana, vision, "ed", "owner");
  EXPECT_EQ(StatusOf(ana->Delete(path + "/membership")), 204);
  EXPECT_EQ(StatusOf(ana->Get(path)), 404);  // no longer hers to see
  const json members = (*ed->Get(path)->Json())["members"];
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0]["name"], "ed");
  // Bad input changes nothing.
  EXPECT_EQ(StatusOf(ed->PostJson(path + "/members", {{"user", "nobody"}, {"role", "viewer"}})), 404);
  EXPECT_EQ(StatusOf(ed->PostJson(path + "/members", {{"user", "ana"}, {"role", "admin"}})), 400);
  EXPECT_EQ(StatusOf(admin_->PostJson("/api/v1/projects", {{"name", "Vision!"}})), 400);
  EXPECT_EQ(StatusOf(admin_->PostJson("/api/v1/projects", {{"name", "vision"}})), 409);
  EXPECT_EQ((*ed->Get(path)->Json())["members"].size(), 1u);
  // ed, the owner now, reads vision's audit records, named by project; none of another project's.
  NewProject("speech", "admin");
  ASSERT_TRUE(admin_->PostJson("/api/v1/workers?project=speech", {{"name", "elsewhere"}}).ok());
  ASSERT_TRUE(ed->PostJson("/api/v1/workers?project=vision", {{"name", "mine"}}).ok());
  StatusOr<http::ClientResponse> audit = ed->Get("/api/v1/audit?project=vision");
  ASSERT_TRUE(audit.ok()) << audit.status().ToString();
  const json records = (*audit->Json())["records"];
  ASSERT_FALSE(records.empty());
  for (const json& r : records) EXPECT_EQ(r["project"], "vision") << r.dump();
  EXPECT_EQ(records.back()["action"], "POST /api/v1/workers");
  EXPECT_EQ(records.back()["actor"], "ed");
  EXPECT_EQ(StatusOf(ed->Get("/api/v1/audit")), 403);                 // the whole log is the platform's
  EXPECT_EQ(StatusOf(ed->Get("/api/v1/audit?project=speech")), 404);  // not his project
  StatusOr<http::ClientResponse> all = admin_->Get("/api/v1/audit?project=vision");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all->Json())["records"].size(), records.size());  // a platform admin's view of one project
}

TEST_F(ProjectsTest, TheCliActsInTheProjectItsFlagEnvironmentOrConfigNames) {
  const std::string key = "--api-key=" + server_->admin_key();
  auto [created, created_out] = Cli({"project", "create", "vision", key});
  ASSERT_EQ(created, 0) << created_out;
  EXPECT_THAT(created_out, HasSubstr("project 2 'vision' created"));
  auto [registered, registered_out] = Cli({"worker", "register", "--name", "flagged", "--project", "vision", key});
  ASSERT_EQ(registered, 0) << registered_out;
  const std::filesystem::path config = dir_.path() / "config.toml";
  std::ofstream(config) << "project = \"vision\"\n";
  auto [by_env, env_out] = Cli({"worker", "list", key}, {{"PARSYN_PROJECT", "vision"}});
  ASSERT_EQ(by_env, 0) << env_out;
  EXPECT_THAT(env_out, HasSubstr("flagged"));
  auto [by_config, config_out] = Cli({"worker", "list", "--config", config.string(), key});
  ASSERT_EQ(by_config, 0) << config_out;
  EXPECT_THAT(config_out, HasSubstr("flagged"));
  auto [in_default, default_out] = Cli({"worker", "list", key});
  ASSERT_EQ(in_default, 0) << default_out;
  EXPECT_THAT(default_out, Not(HasSubstr("flagged")));
  auto [unknown, unknown_out] = Cli({"worker", "list", "--project", "nope", key});
  EXPECT_NE(unknown, 0);
  EXPECT_THAT(unknown_out, HasSubstr("project 'nope' not found"));
  // Members by name.
  ASSERT_TRUE(admin_->PostJson("/api/v1/users", {{"name", "ed"}}).ok());
  auto [added, added_out] = Cli({"project", "add-member", "vision", "ed", "--role", "editor", key});
  ASSERT_EQ(added, 0) << added_out;
  auto [listed, listed_out] = Cli({"project", "members", "vision", key});
  ASSERT_EQ(listed, 0) << listed_out;
  EXPECT_THAT(listed_out, HasSubstr("editor"));
  auto [removed, removed_out] = Cli({"project", "remove-member", "vision", "ed", key});
  ASSERT_EQ(removed, 0) << removed_out;
  // The project's audit records alone.
  const std::filesystem::path exported = dir_.path() / "vision.jsonl";
  auto [audit, audit_out] = Cli({"audit", "export", "--out", exported.string(), "--project", "vision", key});
  ASSERT_EQ(audit, 0) << audit_out;
  std::ifstream lines(exported);
  int records = 0;
  for (std::string line; std::getline(lines, line); ++records) EXPECT_EQ(json::parse(line)["project"], "vision");
  EXPECT_GE(records, 4);  // the worker, the member added and removed, and the project's creation
  auto [left, left_out] = Cli({"project", "leave", "vision", key});
  EXPECT_NE(left, 0);  // the admin made it and owns it alone: the last owner cannot leave
  EXPECT_THAT(left_out, HasSubstr("last owner"));
}

}  // namespace
}  // namespace parsyn::testing
