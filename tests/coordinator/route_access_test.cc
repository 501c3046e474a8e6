// Who may call each route: the table in docs/operations.md ("Who may call each route") is exactly the routes the
// server registers with their access, and a real server answers every route called with every credential as that
// access says: the credential it needs passes (any answer but 401 and 403), every other is refused (401 for a missing
// or wrong credential, 403 for a user key below the route's role, 404 for a key of a user who is not a member of the
// project the route acts in).
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "base/testing/build_paths.h"
#include "coordinator/service.h"
#include "harness.h"
#include "http/status_codes.h"

namespace parsyn::testing {
namespace {

// "GET /api/v1/datasets/{id}" -> access, from the table's rows "| `GET` | `/api/v1/datasets/{id}` | platform_admin |".
std::map<std::string, std::string> DocumentedAccess() {
  std::ifstream in(test_support::SourcePath("docs/operations.md"));
  const std::regex row(R"(^\| `([A-Z]+)` \| `([^`]+)` \| ([^|]+?) \|)");
  std::map<std::string, std::string> access;
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, row)) access[m[1].str() + " " + m[2].str()] = m[3].str();
  }
  return access;
}

std::vector<coordinator::RouteInfo> ServedRoutes(const std::filesystem::path& data_dir) {
  boost::asio::io_context io;
  coordinator::ServiceOptions options;
  options.data_dir = data_dir;
  auto service = coordinator::Service::Open(io, options);
  EXPECT_TRUE(service.ok()) << service.status().ToString();
  if (!service.ok() || !(*service)->BuildRouter().ok()) return {};
  return (*service)->routes();
}

TEST(RouteAccessTest, TheDocumentedTableIsEveryServedRouteWithItsAccess) {
  TempDir dir;
  const std::map<std::string, std::string> documented = DocumentedAccess();
  std::map<std::string, std::string> served;
  for (const coordinator::RouteInfo& r : ServedRoutes(dir.path() / "data")) {
    served[std::string(http::MethodName(r.method)) + " " + r.pattern] = r.access;
  }
  ASSERT_FALSE(served.empty());
  std::ostringstream table;  // what the document should hold, to paste
  for (const auto& [route, access] : served) {
    const size_t space = route.find(' ');
    table << "| `" << route.substr(0, space) << "` | `" << route.substr(space + 1) << "` | " << access << " |\n";
  }
  EXPECT_EQ(documented, served) << "docs/operations.md, \"Who may call each route\", should be:\n" << table.str();
}

// The project the role test's objects live in, with a member of each role, and the objects its routes' ids name.
struct TeamProject {
  std::map<std::string, std::string> keys;  // credential -> key
  std::map<std::string, std::string> ids;   // collection ("datasets") -> the id its object routes use
};

TeamProject MakeTeamProject(const ServerProcess& server, http::Client& admin) {
  auto post = [&](const std::string& path, const json& body) {
    StatusOr<http::ClientResponse> res = admin.PostJson(path, body);
    EXPECT_TRUE(res.ok()) << path << ": " << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  };
  TeamProject team;
  auto user_key = [&](const std::string& name, bool platform_admin) {
    const json user = post("/api/v1/users", {{"name", name}, {"platform_admin", platform_admin}});
    return post("/api/v1/keys", {{"name", "k"}, {"user_id", user["id"]}})["key"].get<std::string>();
  };
  team.keys = {
      {"no credential", ""},
      {"a wrong key", "puk_0000000000000000000000000000000000000000000000000000000000000000"},
      {"the admin key", server.admin_key()},
      {"a platform_admin's key", user_key("alice", true)},
      {"the owner's key", user_key("olga", false)},
      {"an editor's key", user_key("ed", false)},
      {"a viewer's key", user_key("vic", false)},
      {"a non-member's key", user_key("nora", false)},
      {"a worker token", post("/api/v1/workers", {{"name", "w"}})["token"].get<std::string>()},
  };
  const json project = post("/api/v1/projects", {{"name", "team"}, {"owner", "olga"}});
  const std::string members = "/api/v1/projects/" + project["id"].dump() + "/members";
  post(members, {{"user", "ed"}, {"role", "editor"}});
  post(members, {{"user", "vic"}, {"role", "viewer"}});
  // The team's objects: a job holds its dataset and model (their deletes answer 409 and leave them for the calls
  // after); the worker the routes revoke is not the one whose token is a credential.
  auto in_team = [&](std::string path) {
    return path + (path.find('?') == std::string::npos ? "?" : "&") + "project=team";
  };
  const StatusOr<http::ClientResponse> dataset = admin.Send(
      http::Method::kPost, in_team("/api/v1/datasets?name=rows.jsonl"), TextDataset(8), "application/octet-stream");
  const StatusOr<http::ClientResponse> upload =
      admin.Send(http::Method::kPost, in_team("/api/v1/uploads"), TinyLlamaConfig(), "application/octet-stream");
  EXPECT_TRUE(dataset.ok() && upload.ok());
  if (!dataset.ok() || !upload.ok()) return team;
  const json model =
      post(in_team("/api/v1/models"), {{"name", "tiny"}, {"files", {{"config.json", (*upload->Json())["upload_id"]}}}});
  const json worker = post(in_team("/api/v1/workers"), {{"name", "target"}});
  const json job =
      post(in_team("/api/v1/training-jobs"), {{"name", "j"},
                                              {"dataset_id", (*dataset->Json())["id"]},
                                              {"model_id", model["id"]},
                                              {"config", {{"use_peft", true}, {"lora_r", 4}, {"lora_alpha", 8}}}});
  team.ids = {{"datasets", (*dataset->Json())["id"].dump()},
              {"models", model["id"].dump()},
              {"workers", worker["id"].dump()},
              {"training-jobs", job["id"].dump()},
              {"projects", project["id"].dump()}};
  return team;
}

// Every route, called with every credential: a platform credential, and a member of each role of the project the
// route acts in.
TEST(RouteAccessTest, EveryRouteAnswersEveryCredentialAsItsAccessSays) {
  TempDir dir;
  const std::vector<coordinator::RouteInfo> routes = ServedRoutes(dir.path() / "routes");
  ASSERT_FALSE(routes.empty());
  const std::filesystem::path bootstrap_file = dir.path() / "bootstrap-key";
  const std::string bootstrap_key = "bootstrap-key-0123456789abcdef0123456789abcdef";
  std::ofstream(bootstrap_file) << bootstrap_key << "\n";
  ServerProcess server(dir.path() / "data", {"--worker-bootstrap-key-file", bootstrap_file.string()});
  auto admin = AdminClient(server);
  TeamProject team = MakeTeamProject(server, *admin);
  ASSERT_EQ(team.ids.size(), 5u);
  team.keys["the bootstrap key"] = bootstrap_key;
  const std::set<std::string> platform = {"the admin key", "a platform_admin's key"};
  const std::set<std::string> users = {"the admin key",   "a platform_admin's key", "the owner's key",
                                       "an editor's key", "a viewer's key",         "a non-member's key"};
  // Which credentials each access lets through.
  std::map<std::string, std::set<std::string>> passes = {
      {"signed URL", {}},
      {"platform_admin", platform},
      {"any user", users},
      {"worker token", {"a worker token"}},
      {"worker bootstrap key", {"the bootstrap key"}},
      {"owner", {"the admin key", "a platform_admin's key", "the owner's key"}},
      {"platform_admin, or owner of ?project=", {"the admin key", "a platform_admin's key", "the owner's key"}},
      {"editor", {"the admin key", "a platform_admin's key", "the owner's key", "an editor's key"}},
      {"viewer", {"the admin key", "a platform_admin's key", "the owner's key", "an editor's key", "a viewer's key"}},
  };
  for (const auto& [who, key] : team.keys) {
    passes["open"].insert(who);
    passes["ID token"].insert(who);  // single sign-on is off here: 404 whoever calls
  }
  const std::set<std::string> project_roles = {"owner", "editor", "viewer", "platform_admin, or owner of ?project="};
  int calls = 0;
  for (const coordinator::RouteInfo& route : routes) {
    // Object routes name the team's objects; other ids name nothing, so no call changes what a later one finds. A
    // collection route names the team's project; a task poll does not wait.
    std::string path = route.pattern;
    const std::smatch collection = [&] {
      std::smatch m;
      std::regex_search(path, m, std::regex(R"(^/api/v1/([a-z-]+)/\{id\})"));
      return m;
    }();
    const std::string id =
        !collection.empty() && team.ids.count(collection[1].str()) ? team.ids.at(collection[1].str()) : "999999";
    path = std::regex_replace(path, std::regex(R"(\{id\})"), id);
    path = std::regex_replace(path, std::regex(R"(\{\w+(\.\.\.)?\})"), "999999");
    if (project_roles.count(route.access) && path.find('{') == std::string::npos) path += "?project=team";
    if (path.starts_with("/api/v1/worker/tasks/next")) path += "?wait_ms=0";
    ASSERT_TRUE(passes.count(route.access)) << route.pattern << ": unknown access " << route.access;
    for (const auto& [who, key] : team.keys) {
      http::Client client({.base_url = server.url(), .bearer_token = key, .max_attempts = 1});
      const bool has_body = route.method == http::Method::kPost || route.method == http::Method::kPut;
      // An event stream that was let in answers 200 and stays open: the call's timeout ends it.
      StatusOr<http::ClientResponse> res = client.Send(route.method, path, has_body ? "{}" : "", "application/json",
                                                       {.retry = false, .timeout = std::chrono::seconds(2)});
      const int status = StatusOf(res);
      const std::string call = std::string(http::MethodName(route.method)) + " " + path + " with " + who;
      const bool user_key = users.count(who) > 0;
      if (passes.at(route.access).count(who)) {
        EXPECT_NE(status, 401) << call << ": " << res.status().ToString();
        EXPECT_NE(status, 403) << call << ": " << res.status().ToString();
      } else if (project_roles.count(route.access) && who == "a non-member's key") {
        EXPECT_EQ(status, 404) << call << ": " << res.status().ToString();  // ids and names do not leak
      } else if (project_roles.count(route.access) && user_key) {
        EXPECT_EQ(status, 403) << call << ": " << res.status().ToString();  // a member below the route's role
      } else if (user_key && route.access == "platform_admin") {
        EXPECT_EQ(status, 403) << call << ": " << res.status().ToString();
      } else if (route.access == "signed URL") {
        EXPECT_TRUE(status == 401 || status == 403) << call << ": " << res.status().ToString();
      } else {
        EXPECT_EQ(status, 401) << call << ": " << res.status().ToString();
      }
      ++calls;
      if (path.ends_with("/membership")) {  // a member who left comes back, for the calls after
        for (const auto& [name, role] : {std::pair{"ed", "editor"}, std::pair{"vic", "viewer"}}) {
          ASSERT_TRUE(
              admin->PostJson("/api/v1/projects/" + team.ids["projects"] + "/members", {{"user", name}, {"role", role}})
                  .ok());
        }
      }
    }
  }
  EXPECT_GE(calls, 10 * 50);
}

}  // namespace
}  // namespace parsyn::testing
