#include "data/tabular_model_file.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace parsyn::data {
namespace {

using nlohmann::json;

json ValidFile() {
  return {{"format", "parsyn-tabular"},
          {"model_type", "mlp"},
          {"hidden_sizes", {8, 4}},
          {"label_column", "species"},
          {"feature_names", {"x0", "x1", "x2"}},
          {"class_names", {"a", "b"}},
          {"standardizer", {{"mean", {0.0, 1.0, 2.0}}, {"std", {1.0, 1.0, 0.5}}}}};
}

TEST(TabularModelFileTest, ReadsWhatTheTrainerWrites) {
  auto model = ParseTabularModelFile(ValidFile().dump());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->model_type, "mlp");
  EXPECT_EQ(model->hidden_sizes, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(model->label_column, "species");
  EXPECT_EQ(model->feature_names.size(), 3u);
  EXPECT_EQ(model->standardizer.std[2], 0.5f);
}

TEST(TabularModelFileTest, RejectsWhatTheTrainerCannotLoadNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(json&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"another format", [](json& j) { j["format"] = "sklearn"; }, "\"format\" must be \"parsyn-tabular\""},
      {"unknown model_type", [](json& j) { j["model_type"] = "forest"; }, "model_type 'forest' is not supported"},
      {"no hidden_sizes", [](json& j) { j.erase("hidden_sizes"); }, "'hidden_sizes'"},
      {"mistyped class_names", [](json& j) { j["class_names"] = "a,b"; }, "'class_names'"},
      {"no features", [](json& j) { j["feature_names"] = json::array(); }, "no feature columns"},
      {"one class", [](json& j) { j["class_names"] = {"a"}; }, "at least 2 classes in column 'species', got 1"},
      {"standardizer too short",
       [](json& j) {
         j["standardizer"] = {{"mean", {0.0}}, {"std", {1.0}}};
       },
       "standardizer has 1 features, the model 3"},
      {"standardizer missing std", [](json& j) { j["standardizer"].erase("std"); }, "standardizer: missing \"std\""},
      {"logreg with hidden layers", [](json& j) { j["model_type"] = "logreg"; }, "logreg has no hidden layers"},
      {"zero width", [](json& j) { j["hidden_sizes"] = {0}; }, "hidden sizes must be >= 1"},
  };
  for (const Case& c : cases) {
    json j = ValidFile();
    c.change(j);
    auto model = ParseTabularModelFile(j.dump());
    ASSERT_FALSE(model.ok()) << c.what;
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(model.status().message().find(c.message), std::string::npos)
        << c.what << ": " << model.status().message();
  }
  EXPECT_EQ(ParseTabularModelFile("[1]").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::data
