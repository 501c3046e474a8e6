// docs/openapi.yaml describes exactly the routes the server registers (method and path), and every route with an id
// in its path answers a malformed one with the 400 it documents.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "base/testing/build_paths.h"
#include "coordinator/service.h"
#include "harness.h"

namespace parsyn::testing {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "get /api/v1/datasets/{id}" for every operation under `paths:`.
std::set<std::string> OpenApiOperations(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::set<std::string> ops;
  std::string line, path;
  bool in_paths = false;
  const std::regex path_line(R"(^  (/[^:]*):\s*$)");
  const std::regex method_line(R"(^    (get|put|post|delete|patch|head):)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (line.rfind("paths:", 0) == 0) {
      in_paths = true;
      continue;
    }
    if (!in_paths) continue;
    if (!line.empty() && line[0] != ' ') break;  // the next top-level key
    if (std::regex_search(line, m, path_line))
      path = m[1];
    else if (std::regex_search(line, m, method_line))
      ops.insert(m[1].str() + " " + path);
  }
  return ops;
}

TEST(OpenApiTest, DocumentedRoutesMatchTheServersRoutes) {
  TempDir dir;
  boost::asio::io_context io;
  coordinator::ServiceOptions options;
  options.data_dir = dir.path() / "data";
  auto service = coordinator::Service::Open(io, options);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  ASSERT_TRUE((*service)->BuildRouter().ok());
  std::set<std::string> registered;
  for (const coordinator::RouteInfo& r : (*service)->routes()) {
    // OpenAPI has no multi-segment parameter: "{key...}" is documented as "{key}".
    std::string pattern = std::regex_replace(r.pattern, std::regex(R"(\{(\w+)\.\.\.\})"), "{$1}");
    registered.insert(Lower(http::MethodName(r.method)) + " " + pattern);
  }
  const std::set<std::string> documented =
      OpenApiOperations(std::filesystem::path(test_support::SourcePath("docs/openapi.yaml")));
  ASSERT_FALSE(documented.empty());
  for (const std::string& op : registered) EXPECT_TRUE(documented.count(op)) << "not in openapi.yaml: " << op;
  for (const std::string& op : documented) EXPECT_TRUE(registered.count(op)) << "not served: " << op;
}

// Each operation under `paths:` ("get /api/v1/datasets/{id}") with the statuses its `responses:` document.
std::map<std::string, std::set<int>> OpenApiResponses(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::map<std::string, std::set<int>> responses;
  std::string line, path, op;
  bool in_paths = false;
  const std::regex path_line(R"(^  (/[^:]*):\s*$)");
  const std::regex method_line(R"(^    (get|put|post|delete|patch|head):)");
  const std::regex status_line(R"re(^        "(\d{3})":)re");
  std::smatch m;
  while (std::getline(in, line)) {
    if (line.rfind("paths:", 0) == 0) {
      in_paths = true;
      continue;
    }
    if (!in_paths) continue;
    if (!line.empty() && line[0] != ' ') break;
    if (std::regex_search(line, m, path_line)) {
      path = m[1];
    } else if (std::regex_search(line, m, method_line)) {
      op = m[1].str() + " " + path;
      responses[op];
    } else if (std::regex_search(line, m, status_line)) {
      responses[op].insert(std::stoi(m[1]));
    }
  }
  return responses;
}

// "abc" for {id} in every documented admin route that has one: the server answers 400 invalid_argument naming it,
// and the operation documents that 400. The event stream refuses a query it does not take.
TEST(OpenApiTest, MalformedIdsGetTheDocumented400) {
  TempDir dir;
  ServerProcess server(dir.path() / "data");
  http::Client admin({.base_url = server.url(), .bearer_token = server.admin_key(), .max_attempts = 1});
  int checked = 0;
  for (const auto& [op, statuses] :
       OpenApiResponses(std::filesystem::path(test_support::SourcePath("docs/openapi.yaml")))) {
    const size_t space = op.find(' ');
    std::string path = op.substr(space + 1);
    if (path.find("{id}") == std::string::npos || !path.starts_with("/api/v1/")) continue;
    path = std::regex_replace(path, std::regex(R"(\{id\})"), "abc");
    path = std::regex_replace(path, std::regex(R"(\{name\})"), "model.safetensors");
    const std::string method = op.substr(0, space);
    const http::Method m = method == "get"      ? http::Method::kGet
                           : method == "delete" ? http::Method::kDelete
                           : method == "put"    ? http::Method::kPut
                                                : http::Method::kPost;
    StatusOr<http::ClientResponse> res = admin.Send(m, path, m == http::Method::kPost ? "{}" : "", "application/json");
    EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << op << ": " << res.status().ToString();
    EXPECT_TRUE(statuses.contains(400)) << op << " answers 400 for a malformed id; openapi.yaml does not say so";
    ++checked;
  }
  EXPECT_GE(checked, 13);
  StatusOr<http::ClientResponse> cursor = admin.Get("/api/v1/events?cursor=garbage");
  EXPECT_EQ(cursor.status().code(), StatusCode::kInvalidArgument) << cursor.status().ToString();
  EXPECT_NE(cursor.status().message().find("takes no query parameters but project, got 'cursor'"), std::string::npos)
      << cursor.status().message();
}

}  // namespace
}  // namespace parsyn::testing
