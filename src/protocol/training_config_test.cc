#include "protocol/training_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "protocol/field_reader.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// docs/training.md's config table: key → default, each default cell a JSON value in backticks.
std::map<std::string, json> DocumentedDefaults() {
  std::ifstream in("docs/training.md");  // tests run in the source folder
  std::map<std::string, json> table;
  const std::regex row(R"(^\| `([a-z_]+)` \| `([^`]*)` \|)");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("## ") && !table.empty()) break;  // the config table's section ends here
    std::smatch m;
    if (std::regex_search(line, m, row)) table[m[1]] = json::parse(m[2].str());
  }
  return table;
}

TEST(TrainingConfigTest, DefaultsAreTheDocumentedOnes) {
  const json defaults = TrainingConfigToJson(TrainingConfig{});
  const std::map<std::string, json> documented = DocumentedDefaults();
  ASSERT_FALSE(documented.empty()) << "no config table found in docs/training.md";
  for (const auto& [key, value] : defaults.items()) {
    auto it = documented.find(key);
    ASSERT_NE(it, documented.end()) << "docs/training.md does not list config." << key;
    if (value.is_number()) {
      EXPECT_DOUBLE_EQ(it->second.get<double>(), value.get<double>()) << key;
    } else {
      EXPECT_EQ(it->second, value) << key;
    }
  }
  for (const auto& [key, value] : documented) {
    if (key == "model_type") continue;  // the trainer's own key (trainer_task.h)
    EXPECT_TRUE(defaults.contains(key)) << "docs/training.md lists an unknown key " << key;
  }
}

TEST(TrainingConfigTest, TheJobsDefaults) {
  const TrainingConfig c;
  EXPECT_TRUE(c.use_peft);
  EXPECT_EQ(c.lora_r, 16);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 32);
  EXPECT_DOUBLE_EQ(c.lora_dropout, 0.05);
  EXPECT_TRUE(c.hidden_sizes.empty());
  EXPECT_EQ(c.label_column, "");
  EXPECT_EQ(c.LabelColumn(), "label");
}

// PEFT's "all-linear" (every projection, weights/lora_layout.h) is a target list of its own, though it is no module
// name; other names with a '-' stay refused.
TEST(TrainingConfigTest, AllLinearIsATargetList) {
  auto all = ParseTrainingConfig(json{{"lora_target_modules", {"all-linear"}}});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->lora_target_modules, std::vector<std::string>{"all-linear"});
  EXPECT_FALSE(ParseTrainingConfig(json{{"lora_target_modules", {"q-proj"}}}).ok());
}

TEST(TrainingConfigTest, ReadsOverTheDefaultsAndRoundTrips) {
  auto c = ParseTrainingConfig(json{{"epochs", 3},
                                    {"mixed_precision", "bf16"},
                                    {"lora_target_modules", {"q_proj", "k_proj"}},
                                    {"lr_scheduler", "cosine"},
                                    {"seed", 9007199254740992ULL},
                                    {"label_column", "class"},
                                    {"hidden_sizes", {64, 32}},
                                    {"lora_r", nullptr}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->epochs, 3);
  EXPECT_EQ(c->mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(c->lr_scheduler, LrScheduler::kCosine);
  EXPECT_EQ(c->lora_r, 16);  // null: the default
  EXPECT_EQ(c->LabelColumn(), "class");
  EXPECT_EQ(c->hidden_sizes, (std::vector<int>{64, 32}));
  auto again = ParseTrainingConfig(TrainingConfigToJson(*c));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *c);
  EXPECT_EQ(*ParseTrainingConfig(json::object()), TrainingConfig{});
}

TEST(TrainingConfigTest, NamesEveryBadField) {
  auto c = ParseTrainingConfig(json{{"lora_r", 0}, {"lerning_rate", 0.1}, {"mixed_precision", "fp8"}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got \"fp8\"; config.lora_r (0) must be "
            "between 1 and 1024; unknown field config.lerning_rate");
  EXPECT_EQ(ParseTrainingConfig(json::array()).status().message(), "config must be an object, got array");
  EXPECT_THAT(ParseTrainingConfig(
                  json{{"hidden_sizes", json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})}})
                  .status()
                  .message(),
              HasSubstr("config.hidden_sizes has 17 entries, at most 16 are allowed"));
}

TEST(FieldReaderTest, ParseJsonTextKeepsTheReadablePartOfTheError) {
  auto parsed = ParseJsonText("{", "request body");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("request body is not valid JSON: parse error at line 1"));
}

// {"round": 1, "round": 9} means 1 to one parser and 9 to another: neither is taken.
TEST(FieldReaderTest, ParseJsonTextRefusesAKeyTwiceInOneObject) {
  EXPECT_EQ(ParseJsonText(R"({"round": 1, "round": 9})", "request body").status().message(),
            "request body has the key 'round' twice in one object");
  EXPECT_EQ(ParseJsonText(R"({"a": [{"b": 1}, {"b": 2, "c": {"b": 3, "d": 4, "d": 5}}]})", "task").status().message(),
            "task has the key 'd' twice in one object");
  // The same key in sibling or nested objects is fine.
  auto parsed = ParseJsonText(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})", "request body");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ((*parsed)["b"][1]["a"], 3);
}

}  // namespace
}  // namespace parsyn::protocol
