#include "worker/task_translation.h"

#include <gtest/gtest.h>

namespace parsyn::worker {
namespace {

using nlohmann::json;

protocol::Task TrainTaskMessage() {
  json config = protocol::TrainingConfigToJson(protocol::TrainingConfig{});
  config["batch_size"] = 2;
  config["use_peft"] = true;
  auto task = protocol::ParseTask(
      json{{"task_id", "3-2-1-w5"},
           {"job_id", 3},
           {"kind", "train"},
           {"round", 2},
           {"attempt", 1},
           {"total_rounds", 4},
           {"shard", 1},
           {"seed", 99},
           {"steps_per_round", 10},
           {"config", config},
           {"global_weights", {{"url", "http://h/blobs/g?sig=0"}, {"sha256", std::string(64, 'a')}}},
           {"data", json::object()},
           {"model", json::object()},
           {"update_upload", {{"url", "http://h/blobs/x?sig=1"}, {"blob_key", "jobs/3/u"}}}});
  EXPECT_TRUE(task.ok()) << task.status().ToString();
  return *task;
}

TEST(BuildTrainerTaskTest, TrainTaskContinuesOneScheduleAcrossRounds) {
  protocol::Task task = TrainTaskMessage();
  task.model.model_type = "llama";
  TaskFiles files{.model_dir = "/c/models/m",
                  .global_weights = "/c/t/global.safetensors",
                  .data = "/c/d.train.jsonl",
                  .validation_data = "/c/d.validation.jsonl",
                  .data_format = "jsonl",
                  .output_dir = "/c/t/out"};
  const protocol::TrainerTask out = BuildTrainerTask(task, files, "cpu", 1);
  EXPECT_EQ(out.steps, 10);
  EXPECT_EQ(out.seed, 99u);
  task.seed = 0xffff'ffff'ffff'fff0ULL;  // the coordinator's seeds use all 64 bits
  EXPECT_EQ(BuildTrainerTask(task, files, "cpu", 1).seed, 0x7fff'ffff'ffff'fff0ULL);
  EXPECT_EQ(out.schedule, (protocol::TrainerSchedule{.start_step = 10, .total_steps = 40}));
  // The platform's validation rows travel as their own file, and the config goes to the trainer as the job has it:
  // the trainer and the job share one schema and one set of defaults, so nothing is patched on the way.
  EXPECT_EQ(out.kind, protocol::TaskKind::kTrain);
  EXPECT_EQ(out.model_kind, "llama");
  EXPECT_EQ(out.data, "/c/d.train.jsonl");
  EXPECT_EQ(out.validation_data, "/c/d.validation.jsonl");
  EXPECT_FALSE(out.validation_fraction.has_value());
  EXPECT_EQ(out.config.training, task.config);
  EXPECT_EQ(out.config.training.batch_size, 2);
  EXPECT_FALSE(out.config.model_type.has_value());
  EXPECT_EQ(out.model_dir, "/c/models/m");
  EXPECT_EQ(out.initial_weights, "/c/t/global.safetensors");
  EXPECT_EQ(out.output_weights, "/c/t/out/update.safetensors");
  EXPECT_EQ(out.output_result, "/c/t/out/result.json");
  EXPECT_EQ(out.threads, 1);
  EXPECT_EQ(out.proximal_mu, 0);  // a FedAvg task
  // What the trainer reads back is what was built.
  EXPECT_EQ(*protocol::ParseTrainerTask(protocol::TrainerTaskToJson(out)), out);
}

// FedProx: a train task's mu goes to the trainer, anchored by the task's global (its initial_weights); an evaluate
// task trains nothing, so it carries none.
TEST(BuildTrainerTaskTest, TrainTaskPassesProximalMu) {
  protocol::Task task = TrainTaskMessage();
  task.proximal_mu = 0.25;
  TaskFiles files{.global_weights = "g", .data = "d.csv", .data_format = "csv", .output_dir = "o"};
  const protocol::TrainerTask out = BuildTrainerTask(task, files, "cpu", 0);
  EXPECT_EQ(out.proximal_mu, 0.25);
  EXPECT_EQ(out.initial_weights, "g");
  EXPECT_EQ(protocol::TrainerTaskToJson(out)["proximal_mu"], 0.25);
  EXPECT_EQ(*protocol::ParseTrainerTask(protocol::TrainerTaskToJson(out)), out);
  task.kind = protocol::TaskKind::kEvaluate;
  task.update_upload.reset();
  EXPECT_EQ(BuildTrainerTask(task, files, "cpu", 0).proximal_mu, 0);
}

TEST(BuildTrainerTaskTest, EvaluateTaskRunsNoStepsAndTabularHasNoModelDir) {
  protocol::Task task = TrainTaskMessage();
  task.kind = protocol::TaskKind::kEvaluate;
  task.update_upload.reset();
  TaskFiles files{.global_weights = "g", .data = "d.csv", .data_format = "csv", .output_dir = "o"};
  const protocol::TrainerTask out = BuildTrainerTask(task, files, "cuda:1", 0);
  EXPECT_EQ(out.kind, protocol::TaskKind::kEvaluate);
  EXPECT_EQ(out.steps, 0);
  EXPECT_FALSE(out.schedule.has_value());
  EXPECT_TRUE(out.model_dir.empty());
  EXPECT_FALSE(out.validation_fraction.has_value());
  EXPECT_EQ(out.device, "cuda:1");
  const json j = protocol::TrainerTaskToJson(out);
  EXPECT_FALSE(j.contains("schedule"));
  EXPECT_FALSE(j.contains("model_dir"));
  EXPECT_FALSE(j.contains("validation_fraction"));
}

TEST(BuildTrainerTaskTest, EpochRoundsHaveNoStepBudget) {
  // steps_per_round 0: each round trains config.epochs passes over the shard (an ordinary one-worker job).
  protocol::Task task = TrainTaskMessage();
  task.steps_per_round = 0;
  const protocol::TrainerTask out = BuildTrainerTask(task, TaskFiles{.data = "d.csv", .output_dir = "o"}, "cpu", 0);
  EXPECT_FALSE(out.steps.has_value());
  EXPECT_FALSE(out.schedule.has_value());
  EXPECT_TRUE(protocol::ParseTrainerTask(protocol::TrainerTaskToJson(out)).ok());
}

TEST(BuildTrainerTaskTest, OwnDataIsSplitByTheJobsSeedWithTheConfigsFraction) {
  protocol::Task task = TrainTaskMessage();
  EXPECT_EQ(BuildTrainerTask(task, TaskFiles{.data = "d.csv", .output_dir = "o"}, "cpu", 0).split_seed, 0u);
  task.data_source = protocol::DataSource::kWorkers;
  task.config.seed = 1234;
  task.config.validation_fraction = 0.2;
  const protocol::TrainerTask out =
      BuildTrainerTask(task, TaskFiles{.data = "/home/me/own.csv", .data_format = "csv", .output_dir = "o"}, "cpu", 0);
  // Every round holds out the same rows of the worker's file: the job's seed, not the task's.
  EXPECT_EQ(out.split_seed, 1234u);
  EXPECT_EQ(out.data, "/home/me/own.csv");
  EXPECT_FALSE(out.validation_fraction.has_value());
  EXPECT_DOUBLE_EQ(out.ValidationFraction(), 0.2);
}

TEST(BuildResultTest, ReportsSamplesLossesAndTheReceivedGlobalsValidation) {
  const protocol::Task task = TrainTaskMessage();
  const protocol::TrainerResult result{.num_samples = 120,
                                       .num_validation = 30,
                                       .train_loss = 2.5,
                                       .validation_before = {{"loss", 3.0}, {"accuracy", 0.1}},
                                       .validation_after = {{"loss", 2.4}},
                                       .metrics = {{"steps", 10}, {"f1", 0.5}}};
  const json body = protocol::ResultToJson(BuildResult(task, "pss_x", result, "jobs/3/u", "ab"));
  EXPECT_EQ(body["session_id"], "pss_x");
  EXPECT_EQ(body["sample_count"], 120);
  EXPECT_EQ(body["validation_samples"], 30);
  EXPECT_EQ(body["train_loss"], 2.5);
  EXPECT_EQ(body["validation_loss"], 3.0);
  EXPECT_EQ(body["blob_key"], "jobs/3/u");
  EXPECT_EQ(body["sha256"], "ab");
  EXPECT_EQ(body["round"], 2);
  EXPECT_EQ(body["attempt"], 1);
  EXPECT_EQ(body["metrics"]["validation_after"]["loss"], 2.4);
  EXPECT_EQ(body["metrics"]["steps"], 10);
  EXPECT_FALSE(body["metrics"].contains("f1"));  // a name the coordinator does not keep stays on the worker
  EXPECT_TRUE(protocol::ParseResult(body.dump()).ok());
  // An evaluate task uploads nothing.
  const json evaluated = protocol::ResultToJson(BuildResult(task, "s", result, "", "ab"));
  EXPECT_FALSE(evaluated.contains("blob_key"));
  EXPECT_FALSE(evaluated.contains("sha256"));
}

TEST(BuildProgressTest, CarriesTheTrainersThroughputAndTheUtilization) {
  const protocol::Task task = TrainTaskMessage();
  const protocol::TrainerProgress lm{
      .step = 4, .total_steps = 10, .loss = 1.5, .throughput = 800.0, .throughput_unit = "tokens/s"};
  const json body = protocol::ProgressToJson(BuildProgress(task, "s", lm, 0.5));
  EXPECT_EQ(body["throughput"], 800.0);
  EXPECT_EQ(body["throughput_unit"], "tokens/s");
  EXPECT_EQ(body["utilization"], 0.5);
  EXPECT_EQ(body["step"], 4);
  EXPECT_EQ(body["total_steps"], 10);
  EXPECT_EQ(body["job_id"], 3);
  EXPECT_EQ(body["attempt"], 1);
  const protocol::Progress plain = BuildProgress(task, "s", {.step = 4, .total_steps = 0}, std::nullopt);
  EXPECT_FALSE(plain.throughput.has_value());
  EXPECT_FALSE(plain.total_steps.has_value());
}

}  // namespace
}  // namespace parsyn::worker
