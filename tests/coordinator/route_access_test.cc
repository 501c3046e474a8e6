// Who may call each route: the table in docs/operations.md ("Who may call each route") is exactly the routes the
// server registers with their access, and a real server answers every route called with every credential as that
// access says: the credential it needs passes (any answer but 401 and 403), every other is refused (401 for a missing
// or wrong credential, 403 for a user key below the route's role).
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

// Every route, called with every credential.
TEST(RouteAccessTest, EveryRouteAnswersEveryCredentialAsItsAccessSays) {
  TempDir dir;
  const std::vector<coordinator::RouteInfo> routes = ServedRoutes(dir.path() / "routes");
  ASSERT_FALSE(routes.empty());
  const std::filesystem::path bootstrap_file = dir.path() / "bootstrap-key";
  const std::string bootstrap_key = "bootstrap-key-0123456789abcdef0123456789abcdef";
  std::ofstream(bootstrap_file) << bootstrap_key << "\n";
  ServerProcess server(dir.path() / "data", {"--worker-bootstrap-key-file", bootstrap_file.string()});
  auto admin = AdminClient(server);
  auto post = [&](const std::string& path, const json& body) {
    StatusOr<http::ClientResponse> res = admin->PostJson(path, body);
    EXPECT_TRUE(res.ok()) << path << ": " << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  };
  const json alice = post("/api/v1/users", {{"name", "alice"}, {"platform_admin", true}});
  const json bob = post("/api/v1/users", {{"name", "bob"}});
  const std::map<std::string, std::string> keys = {
      {"no credential", ""},
      {"a wrong key", "puk_0000000000000000000000000000000000000000000000000000000000000000"},
      {"the admin key", server.admin_key()},
      {"a platform_admin's key", post("/api/v1/keys", {{"name", "k"}, {"user_id", alice["id"]}})["key"]},
      {"a user's key", post("/api/v1/keys", {{"name", "k"}, {"user_id", bob["id"]}})["key"]},
      {"a worker token", post("/api/v1/workers", {{"name", "w"}})["token"]},
      {"the bootstrap key", bootstrap_key},
  };
  // Which credentials each access lets through; the others get `refused` (or 403 for a user below the role).
  const std::map<std::string, std::set<std::string>> passes = {
      {"open",
       {"no credential", "a wrong key", "the admin key", "a platform_admin's key", "a user's key", "a worker token",
        "the bootstrap key"}},
      {"signed URL", {}},
      // A sign-in's credential is the provider's ID token in the request: no header is refused as such (single
      // sign-on is off here: 404).
      {"ID token",
       {"no credential", "a wrong key", "the admin key", "a platform_admin's key", "a user's key", "a worker token",
        "the bootstrap key"}},
      {"platform_admin", {"the admin key", "a platform_admin's key"}},
      {"any user", {"the admin key", "a platform_admin's key", "a user's key"}},
      {"worker token", {"a worker token"}},
      {"worker bootstrap key", {"the bootstrap key"}},
  };
  int calls = 0;
  for (const coordinator::RouteInfo& route : routes) {
    // Ids that name nothing, so no call changes what a later one finds; a task poll that does not wait.
    std::string path = std::regex_replace(route.pattern, std::regex(R"(\{id\})"), "999999");
    path = std::regex_replace(path, std::regex(R"(\{\w+(\.\.\.)?\})"), "x");
    if (path == "/api/v1/worker/tasks/next") path += "?wait_ms=0";
    ASSERT_TRUE(passes.count(route.access)) << route.pattern << ": unknown access " << route.access;
    for (const auto& [who, key] : keys) {
      http::Client client({.base_url = server.url(), .bearer_token = key, .max_attempts = 1});
      const bool has_body = route.method == http::Method::kPost || route.method == http::Method::kPut;
      // An event stream that was let in answers 200 and stays open: the call's timeout ends it.
      StatusOr<http::ClientResponse> res = client.Send(route.method, path, has_body ? "{}" : "", "application/json",
                                                       {.retry = false, .timeout = std::chrono::seconds(2)});
      const int status = res.ok() ? res->status : http::HttpStatusFor(res.status().code());
      const std::string call = std::string(http::MethodName(route.method)) + " " + path + " with " + who;
      if (passes.at(route.access).count(who)) {
        EXPECT_NE(status, 401) << call << ": " << res.status().ToString();
        EXPECT_NE(status, 403) << call << ": " << res.status().ToString();
      } else if (who == "a user's key" && route.access == "platform_admin") {
        EXPECT_EQ(status, 403) << call << ": " << res.status().ToString();
      } else if (route.access == "signed URL") {
        EXPECT_TRUE(status == 401 || status == 403) << call << ": " << res.status().ToString();
      } else {
        EXPECT_EQ(status, 401) << call << ": " << res.status().ToString();
      }
      ++calls;
    }
  }
  EXPECT_GE(calls, 7 * 45);
}

}  // namespace
}  // namespace parsyn::testing
