#include "worker/trainer_task.h"

#include <gtest/gtest.h>

namespace parsyn::worker {
namespace {

using nlohmann::json;

json TrainTask() {
  return {
      {"task_id", "3-2-1-w5"},
      {"job_id", 3},
      {"kind", "train"},
      {"round", 2},
      {"attempt", 1},
      {"total_rounds", 4},
      {"shard", 1},
      {"seed", 99},
      {"steps_per_round", 10},
      {"config",
       {{"batch_size", 2}, {"use_peft", true}, {"seed", 42}, {"label_column", ""}, {"hidden_sizes", json::array()}}},
      {"update_upload", {{"url", "http://h/blobs/x?sig=1"}, {"blob_key", "jobs/3/u"}}}};
}

TEST(ParseTaskHeaderTest, ReadsTheFieldsTheAgentUses) {
  StatusOr<TaskHeader> h = ParseTaskHeader(TrainTask());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->task_id, "3-2-1-w5");
  EXPECT_EQ(h->job_id, 3);
  EXPECT_EQ(h->round, 2);
  EXPECT_EQ(h->total_rounds, 4);
  EXPECT_EQ(h->shard, 1);
  EXPECT_EQ(h->steps_per_round, 10);
}

TEST(ParseTaskHeaderTest, NamesTheMissingOrMistypedField) {
  json task = TrainTask();
  task.erase("round");
  EXPECT_EQ(ParseTaskHeader(task).status().message(), "task: missing 'round'");
  task = TrainTask();
  task["job_id"] = "three";
  EXPECT_EQ(ParseTaskHeader(task).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseTaskHeader(task).status().message().find("'job_id' has the wrong type"), std::string::npos);
  task = TrainTask();
  task.erase("update_upload");
  EXPECT_EQ(ParseTaskHeader(task).status().message(), "task: a train task without 'update_upload'");
  task = TrainTask();
  task["kind"] = "bake";
  EXPECT_EQ(ParseTaskHeader(task).status().message(), "task: unknown kind 'bake'");
}

TEST(BuildTrainerTaskTest, TrainTaskContinuesOneScheduleAcrossRounds) {
  json task = TrainTask();
  TaskHeader h = *ParseTaskHeader(task);
  TaskFiles files{.model_dir = "/c/models/m",
                  .global_weights = "/c/t/global.safetensors",
                  .data = "/c/d.jsonl",
                  .data_format = "jsonl",
                  .validation_fraction = 0.25,
                  .output_dir = "/c/t/out"};
  StatusOr<json> out = BuildTrainerTask(task, h, files, "cpu", 1);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)["steps"], 10);
  EXPECT_EQ((*out)["seed"], 99);
  task["seed"] = 0xffff'ffff'ffff'fff0ULL;  // the coordinator's seeds use all 64 bits
  EXPECT_EQ((*BuildTrainerTask(task, h, files, "cpu", 1))["seed"], 0x7fff'ffff'ffff'fff0ULL);
  EXPECT_EQ((*out)["schedule"], (json{{"start_step", 10}, {"total_steps", 40}}));
  EXPECT_EQ((*out)["config"]["validation_fraction"], 0.25);
  EXPECT_EQ((*out)["config"]["batch_size"], 2);
  EXPECT_EQ((*out)["config"], (json{{"batch_size", 2}, {"use_peft", true}, {"validation_fraction", 0.25}}));
  EXPECT_EQ((*out)["model_dir"], "/c/models/m");
  EXPECT_EQ((*out)["initial_weights"], "/c/t/global.safetensors");
  EXPECT_EQ((*out)["output"]["weights"], "/c/t/out/update.safetensors");
  EXPECT_EQ((*out)["threads"], 1);
}

TEST(BuildTrainerTaskTest, EvaluateTaskRunsNoStepsAndTabularHasNoModelDir) {
  json task = TrainTask();
  task["kind"] = "evaluate";
  task.erase("update_upload");
  TaskHeader h = *ParseTaskHeader(task);
  TaskFiles files{.global_weights = "g", .data = "d.csv", .data_format = "csv", .output_dir = "o"};
  StatusOr<json> out = BuildTrainerTask(task, h, files, "cuda:1", 0);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)["steps"], 0);
  EXPECT_FALSE(out->contains("schedule"));
  EXPECT_FALSE(out->contains("model_dir"));
  EXPECT_FALSE((*out)["config"].contains("validation_fraction"));
  EXPECT_EQ((*out)["device"], "cuda:1");
}

TEST(BuildResultReportTest, ReportsSamplesLossesAndTheReceivedGlobalsValidation) {
  TaskHeader h = *ParseTaskHeader(TrainTask());
  json done = {{"event", "done"},
               {"samples_used", 120},
               {"num_validation", 30},
               {"mean_train_loss", 2.5},
               {"validation_before", {{"loss", 3.0}, {"accuracy", 0.1}}},
               {"validation_after", {{"loss", 2.4}}},
               {"steps", 10},
               {"weights_sha256", "ab"}};
  StatusOr<json> r = BuildResultReport(h, "pss_x", done, "jobs/3/u", "ab");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["sample_count"], 120);
  EXPECT_EQ((*r)["validation_samples"], 30);
  EXPECT_EQ((*r)["train_loss"], 2.5);
  EXPECT_EQ((*r)["validation_loss"], 3.0);
  EXPECT_EQ((*r)["blob_key"], "jobs/3/u");
  EXPECT_EQ((*r)["sha256"], "ab");
  EXPECT_EQ((*r)["round"], 2);
  EXPECT_EQ((*r)["metrics"]["validation_after"]["loss"], 2.4);
  EXPECT_EQ(BuildResultReport(h, "s", json{{"num_validation", 1}}, "", "").status().message(),
            "task: missing 'samples_used'");
}

TEST(BuildProgressReportTest, PrefersTokensPerSecondAndIgnoresOtherEvents) {
  TaskHeader h = *ParseTaskHeader(TrainTask());
  json lm = {{"event", "progress"},  {"step", 4}, {"total_steps", 10}, {"loss", 1.5}, {"tokens_per_s", 800.0},
             {"samples_per_s", 12.0}};
  std::optional<json> r = BuildProgressReport(h, "s", lm, 0.5);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*r)["throughput"], 800.0);
  EXPECT_EQ((*r)["utilization"], 0.5);
  EXPECT_EQ((*r)["step"], 4);
  json tabular = {{"event", "progress"}, {"step", 4}, {"tokens_per_s", 0.0}, {"samples_per_s", 12.0}};
  EXPECT_EQ((*BuildProgressReport(h, "s", tabular, std::nullopt))["throughput"], 12.0);
  EXPECT_FALSE(BuildProgressReport(h, "s", json{{"event", "eval"}, {"step", 1}}, std::nullopt).has_value());
}

}  // namespace
}  // namespace parsyn::worker
