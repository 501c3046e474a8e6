#include "trainer/train_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace parsyn::trainer {
namespace {

using nlohmann::json;

TEST(TrainConfigTest, EmptyObjectGivesTheJobsDefaults) {
  auto config = ParseTrainConfig(json::object());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->epochs, 1);
  EXPECT_EQ(config->mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(config->lora_target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  // One set of defaults: the job's (protocol::TrainingConfig), not a trainer's own.
  const protocol::TrainingConfig job;
  EXPECT_EQ(config->use_peft, job.use_peft);
  EXPECT_EQ(config->lora_r, job.lora_r);
  EXPECT_DOUBLE_EQ(config->lora_alpha, job.lora_alpha);
  EXPECT_DOUBLE_EQ(config->lora_dropout, job.lora_dropout);
  EXPECT_TRUE(config->hidden_sizes.empty());
  EXPECT_EQ(config->TabularType(), TabularModelType::kLogreg);  // no hidden layer
  EXPECT_EQ(config->label_column, "label");                     // the job's "" names the column "label"
  EXPECT_EQ(TrainConfigToJson(TrainConfig{}), TrainConfigToJson(*config));
}

TEST(TrainConfigTest, ModelTypeDefaultsFromHiddenSizes) {
  auto mlp = ParseTrainConfig(json{{"hidden_sizes", {16}}});
  ASSERT_TRUE(mlp.ok());
  EXPECT_EQ(mlp->TabularType(), TabularModelType::kMlp);
  auto logreg = ParseTrainConfig(json{{"model_type", "logreg"}, {"label_column", "class"}});
  ASSERT_TRUE(logreg.ok());
  EXPECT_EQ(logreg->TabularType(), TabularModelType::kLogreg);
  EXPECT_EQ(logreg->label_column, "class");
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
      {R"({"epoch": 3})", "unknown field config.epoch"},
      {R"({"batch_size": 0})", "config.batch_size (0) must be between 1 and 65536"},
      {R"({"batch_size": 2.5})", "config.batch_size must be an integer, got 2.5"},
      {R"({"learning_rate": "fast"})", "config.learning_rate must be a number, got string"},
      {R"({"learning_rate": 0})", "config.learning_rate (0) must be > 0 and <= 10"},
      {R"({"mixed_precision": "fp8"})",
       "config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got \"fp8\""},
      {R"({"lr_scheduler": "step"})",
       "config.lr_scheduler must be one of \"constant\", \"linear\", \"cosine\", got \"step\""},
      {R"({"validation_fraction": 1})", "config.validation_fraction (1) must be >= 0 and <= 0.5"},
      {R"({"lora_target_modules": []})", "config.lora_target_modules must be an array of 1..64 module names"},
      {R"({"use_peft": "yes"})", "config.use_peft must be a boolean, got string"},
      {R"({"hidden_sizes": [16, 0]})", "config.hidden_sizes[1] (0) must be between 1 and 65536"},
      {R"({"model_type": "tree"})", "config.model_type must be one of \"mlp\", \"logreg\", got \"tree\""},
      {R"([1, 2])", "config must be an object, got array"},
  };
  for (const Case& c : cases) {
    auto config = ParseTrainConfig(json::parse(c.json));
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << c.json << " -> " << config.status().message();
  }
}

TEST(TrainConfigTest, NullMeansDefault) {
  auto config = ParseTrainConfig(json::parse(R"({"epochs": null, "batch_size": 4, "mixed_precision": null})"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->epochs, 1);
  EXPECT_EQ(config->batch_size, 4);
  EXPECT_EQ(config->mixed_precision, MixedPrecision::kNo);
}

}  // namespace
}  // namespace parsyn::trainer
