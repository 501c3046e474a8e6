// docs/openapi.yaml describes exactly the routes the server registers (method and path).
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <fstream>
#include <regex>
#include <set>

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
      OpenApiOperations(std::filesystem::path(PARSYN_SOURCE_DIR) / "docs" / "openapi.yaml");
  ASSERT_FALSE(documented.empty());
  for (const std::string& op : registered) EXPECT_TRUE(documented.count(op)) << "not in openapi.yaml: " << op;
  for (const std::string& op : documented) EXPECT_TRUE(registered.count(op)) << "not served: " << op;
}

}  // namespace
}  // namespace parsyn::testing
