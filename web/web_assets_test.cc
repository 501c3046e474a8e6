#include "web/web_assets.h"
#include "base/testing/missing_dependency.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "coordinator/strategy_spec.h"
#include "protocol/training_config.h"

namespace parsyn::web {
namespace {

std::string ReadSource(const std::string& path) {
  std::ifstream in(path, std::ios::binary);  // tests run in the source tree's root
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(WebAssetsTest, EmbedsTheAppFilesByteForByteWithTheirContentTypes) {
  const WebAsset* index = FindWebAsset("index.html");
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(index->bytes, ReadSource("web/app/index.html"));

  const WebAsset* app = FindWebAsset("app.js");
  ASSERT_NE(app, nullptr);
  EXPECT_EQ(app->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(app->bytes, ReadSource("web/app/app.js"));

  const WebAsset* css = FindWebAsset("app.css");
  ASSERT_NE(css, nullptr);
  EXPECT_EQ(css->content_type, "text/css; charset=utf-8");
}

TEST(WebAssetsTest, EmbedsTheJobFormsDefaultsGeneratedFromTheSchema) {
  const WebAsset* defaults = FindWebAsset("training_defaults.js");
  ASSERT_NE(defaults, nullptr);
  EXPECT_EQ(defaults->content_type, "text/javascript; charset=utf-8");
  const std::string expected = "export const TRAINING_DEFAULTS = Object.freeze(" +
                               protocol::TrainingConfigToJson(protocol::TrainingConfig{}).dump() + ");\n";
  EXPECT_NE(std::string(defaults->bytes).find(expected), std::string::npos) << defaults->bytes;
}

TEST(WebAssetsTest, EmbedsTheJobFormsStrategiesGeneratedFromTheRegistry) {
  const WebAsset* defaults = FindWebAsset("training_defaults.js");
  ASSERT_NE(defaults, nullptr);
  const std::string expected =
      "export const STRATEGIES = Object.freeze(" + coordinator::StrategyCatalogJson().dump() + ");\n";
  EXPECT_NE(std::string(defaults->bytes).find(expected), std::string::npos) << defaults->bytes;
}

TEST(WebAssetsTest, UnknownPathsAreAbsent) {
  EXPECT_EQ(FindWebAsset("missing.js"), nullptr);
  EXPECT_EQ(FindWebAsset("/index.html"), nullptr);  // paths carry no leading slash
  EXPECT_EQ(FindWebAsset(""), nullptr);
}

TEST(WebAssetsTest, EmbedsUplotWhenNodeModulesWereInstalled) {
  const std::string source = ReadSource("web/node_modules/uplot/dist/uPlot.esm.js");
  if (source.empty()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY("web/node_modules is absent (./dev setup installs it)");
  const WebAsset* uplot = FindWebAsset("vendor/uPlot.esm.js");
  ASSERT_NE(uplot, nullptr);
  EXPECT_EQ(uplot->bytes, source);
}

}  // namespace
}  // namespace parsyn::web
