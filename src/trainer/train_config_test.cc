#include "trainer/train_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace parsyn::trainer {
namespace {

using nlohmann::json;

TEST(TrainConfigTest, EmptyObjectGivesDefaults) {
  auto config = ParseTrainConfig(json::object());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->epochs, 1);
  EXPECT_EQ(config->mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(config->lora_target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST(TrainConfigTest, ReadsTheSpecExample) {
  auto config = ParseTrainConfig(json::parse(R"({"epochs": 3, "batch_size": 4, "learning_rate": 2e-4,
      "mixed_precision": "bf16", "use_peft": true, "lora_r": 16, "lora_alpha": 32})"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->epochs, 3);
  EXPECT_EQ(config->batch_size, 4);
  EXPECT_DOUBLE_EQ(config->learning_rate, 2e-4);
  EXPECT_EQ(config->mixed_precision, MixedPrecision::kBf16);
  EXPECT_TRUE(config->use_peft);
  EXPECT_EQ(config->lora_r, 16);
  EXPECT_DOUBLE_EQ(config->lora_alpha, 32);
}

TEST(TrainConfigTest, RoundTripsThroughJson) {
  TrainConfig c;
  c.epochs = 2;
  c.lr_scheduler = LrScheduler::kCosine;
  c.model_type = TabularModelType::kLogreg;
  c.hidden_sizes = {};
  c.lora_target_modules = {"q_proj", "k_proj", "down_proj"};
  c.max_grad_norm = 0;
  auto back = ParseTrainConfig(TrainConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(TrainConfigToJson(*back), TrainConfigToJson(c));
}

TEST(TrainConfigTest, RejectsBadValuesNamingTheKey) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"({"epoch": 3})", "config.epoch: unknown key"},
      {R"({"batch_size": 0})", "config.batch_size: must be >= 1, got 0"},
      {R"({"batch_size": 2.5})", "config.batch_size: expected an integer, got 2.5"},
      {R"({"learning_rate": "fast"})", "config.learning_rate: expected a number, got string"},
      {R"({"learning_rate": 0})", "config.learning_rate: must be > 0"},
      {R"({"mixed_precision": "fp8"})", "config.mixed_precision: unknown value \"fp8\""},
      {R"({"lr_scheduler": "step"})", "config.lr_scheduler: unknown value \"step\""},
      {R"({"validation_fraction": 1})", "config.validation_fraction: must be in [0, 1)"},
      {R"({"lora_target_modules": []})", "config.lora_target_modules: expected a non-empty array"},
      {R"({"use_peft": "yes"})", "config.use_peft: expected true or false, got string"},
      {R"({"hidden_sizes": [16, 0]})", "config.hidden_sizes: must be >= 1"},
      {R"([1, 2])", "config: expected a JSON object, got array"},
  };
  for (const Case& c : cases) {
    auto config = ParseTrainConfig(json::parse(c.json));
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << c.json << " -> " << config.status().message();
  }
}

TEST(TrainConfigTest, NullMeansDefaultAndWholeFloatsAreIntegers) {
  auto config = ParseTrainConfig(json::parse(R"({"epochs": null, "batch_size": 4.0, "mixed_precision": "fp32"})"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->epochs, 1);
  EXPECT_EQ(config->batch_size, 4);
  EXPECT_EQ(config->mixed_precision, MixedPrecision::kNo);
}

}  // namespace
}  // namespace parsyn::trainer
