#include "protocol/trainer_task.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace parsyn::protocol {
namespace {

using nlohmann::json;

TEST(TrainerConfigTest, ModelTypeFollowsHiddenSizesUnlessGiven) {
  TrainerConfig c;
  EXPECT_EQ(c.TabularType(), TabularModelType::kLogreg);  // the job's default: no hidden layer
  c.training.hidden_sizes = {16};
  EXPECT_EQ(c.TabularType(), TabularModelType::kMlp);
  auto parsed = ParseTrainerConfig(json{{"model_type", "logreg"}, {"batch_size", 4}});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->model_type, TabularModelType::kLogreg);
  EXPECT_EQ(parsed->training.batch_size, 4);
  EXPECT_EQ(*ParseTrainerConfig(TrainerConfigToJson(*parsed)), *parsed);
  EXPECT_EQ(ParseTrainerConfig(json{{"model_type", "tree"}}).status().message(),
            "config.model_type must be one of \"mlp\", \"logreg\", got \"tree\"");
}

// An empty object and null values read as the job's defaults (training_config.h), with no model_type.
TEST(TrainerConfigTest, EmptyAndNullMeanTheJobsDefaults) {
  auto empty = ParseTrainerConfig(json::object());
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, TrainerConfig{});
  EXPECT_EQ(empty->training.LabelColumn(), "label");
  auto nulls = ParseTrainerConfig(json::parse(R"({"epochs": null, "batch_size": 4, "mixed_precision": null})"));
  ASSERT_TRUE(nulls.ok()) << nulls.status().ToString();
  EXPECT_EQ(nulls->training.epochs, 1);
  EXPECT_EQ(nulls->training.batch_size, 4);
  EXPECT_EQ(nulls->training.mixed_precision, MixedPrecision::kNo);
}

// What the trainer tells of a bad config key (parsyn-trainer run, tabular-init): the key and the reason.
TEST(TrainerConfigTest, RejectsBadValuesNamingTheKey) {
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
    auto config = ParseTrainerConfig(json::parse(c.json));
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(config.status().message(), ::testing::HasSubstr(c.message)) << c.json;
  }
}

TEST(TrainerTaskTest, RoundTripsEveryField) {
  TrainerTask t;
  t.model_kind = "tabular-mlp";
  t.model_dir = "models/m";
  t.initial_weights = "global.safetensors";
  t.data = "shard.csv";
  t.validation_data = "validation.csv";
  t.data_format = "csv";
  t.config.training.batch_size = 2;
  t.config.model_type = TabularModelType::kMlp;
  t.validation_fraction = 0.75;
  t.steps = 10;
  t.seed = (uint64_t{1} << 63) - 1;
  t.split_seed = 3;
  t.schedule = TrainerSchedule{.start_step = 10, .total_steps = 40};
  t.proximal_mu = 0.5;
  t.device = "cuda:1";
  t.threads = 2;
  t.output_weights = "out/update.safetensors";
  t.output_result = "out/result.json";
  t.output_model_dir = "out/model";
  const json j = TrainerTaskToJson(t);
  auto back = ParseTrainerTask(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, t);
  EXPECT_DOUBLE_EQ(back->ValidationFraction(), 0.75);
  EXPECT_EQ(j["schedule"], (json{{"start_step", 10}, {"total_steps", 40}}));
  EXPECT_EQ(j["proximal_mu"], 0.5);
  EXPECT_EQ(j["contract_version"], 1);
  EXPECT_EQ(j["kind"], "train");
}

TEST(TrainerTaskTest, KindFollowsStepsUnlessGiven) {
  const json output = {{"weights", "w"}, {"result", "r"}};
  auto evaluate = ParseTrainerTask(json{{"data", "d.csv"}, {"steps", 0}, {"output", output}});
  ASSERT_TRUE(evaluate.ok()) << evaluate.status().ToString();
  EXPECT_EQ(evaluate->kind, TaskKind::kEvaluate);
  auto zero_steps = ParseTrainerTask(json{{"data", "d.csv"}, {"kind", "train"}, {"steps", 0}, {"output", output}});
  ASSERT_TRUE(zero_steps.ok()) << zero_steps.status().ToString();
  EXPECT_EQ(zero_steps->kind, TaskKind::kTrain);
  EXPECT_EQ(ParseTrainerTask(json{{"data", "d.csv"}, {"kind", "evaluate"}, {"steps", 5}, {"output", output}})
                .status()
                .message(),
            "task.steps must be 0 (or absent) for an evaluate task, got 5");
  EXPECT_THAT(ParseTrainerTask(json{{"data", "d.csv"}, {"kind", "infer"}, {"output", output}}).status().message(),
              ::testing::HasSubstr("task.kind must be one of \"train\", \"evaluate\""));
}

TEST(TrainerTaskTest, OtherContractVersionsAreRefused) {
  const json output = {{"weights", "w"}, {"result", "r"}};
  json task = {{"contract_version", 1}, {"data", "d.csv"}, {"output", output}};
  EXPECT_TRUE(ParseTrainerTask(task).ok());
  task["contract_version"] = 999;
  EXPECT_EQ(CheckTrainerContractVersion(task).message(),
            "task.contract_version 999 is not supported: this trainer reads version 1");
  EXPECT_EQ(ParseTrainerTask(task).status().code(), StatusCode::kInvalidArgument);
  task.erase("contract_version");
  EXPECT_TRUE(CheckTrainerContractVersion(task).ok());
}

TEST(TrainerTaskTest, OptionalFieldsDefault) {
  auto t = ParseTrainerTask(json{{"data", "d.jsonl"}, {"output", {{"weights", "w"}, {"result", "r"}}}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->config, TrainerConfig{});
  EXPECT_FALSE(t->steps.has_value());
  EXPECT_FALSE(t->schedule.has_value());
  EXPECT_EQ(t->device, "cpu");
  EXPECT_DOUBLE_EQ(t->ValidationFraction(), 0.1);
  EXPECT_EQ(TrainerTaskToJson(*t).count("steps"), 0u);
  EXPECT_EQ(t->proximal_mu, 0);
  EXPECT_EQ(TrainerTaskToJson(*t).count("proximal_mu"), 0u);  // plain training writes the file it always did
}

TEST(TrainerTaskTest, NamesEveryProblemWithItsPath) {
  const json output = {{"weights", "w"}, {"result", "r"}};
  struct Case {
    json task;
    const char* message;
  };
  const Case cases[] = {
      {{{"output", output}}, "task.data is required"},
      {{{"data", "d.csv"}}, "task.output is required"},
      {{{"data", "d.csv"}, {"output", {{"weights", "w"}}}}, "task.output.result is required"},
      {{{"data", "d.csv"}, {"output", output}, {"steps", -1}}, "task.steps (-1) must be between 0 and"},
      {{{"data", "d.csv"}, {"output", output}, {"data_format", "xml"}},
       "task.data_format must be one of \"jsonl\", \"csv\", got \"xml\""},
      {{{"data", "d.csv"}, {"output", output}, {"config", {{"lora_r", 0}}}},
       "config.lora_r (0) must be between 1 and 1024"},
      {{{"data", "d.csv"}, {"output", output}, {"validation_fraction", 1}},
       "task.validation_fraction (1) must be >= 0 and < 1"},
      {{{"data", "d.csv"}, {"output", output}, {"schedule", {{"total_steps", 0}}}},
       "task.schedule.total_steps (0) must be between 1 and"},
      {{{"data", "d.csv"}, {"output", output}, {"proximal_mu", -0.5}},
       "task.proximal_mu (-0.5) must be >= 0 and <= 1e+06"},
      {{{"data", "d.csv"}, {"output", output}, {"proximal_mu", 1e9}},
       "task.proximal_mu (1e+09) must be >= 0 and <= 1e+06"},
      {{{"data", "d.csv"}, {"output", output}, {"colour", 1}}, "unknown field task.colour"},
      {{{"data", ""}, {"output", output}}, "task.data must be 1..4096 bytes long, got 0"},
  };
  for (const Case& c : cases) {
    auto task = ParseTrainerTask(c.task);
    ASSERT_FALSE(task.ok()) << c.task.dump();
    EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(task.status().message(), ::testing::HasSubstr(c.message)) << c.task.dump();
  }
  auto both = ParseTrainerTask(json{{"steps", "many"}});
  EXPECT_EQ(both.status().message(),
            "task.data is required; task.steps must be an integer, got string; "
            "task.output is required");
}

}  // namespace
}  // namespace parsyn::protocol
