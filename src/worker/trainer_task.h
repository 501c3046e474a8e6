// Pure translations between the coordinator's task (GET /api/v1/worker/tasks/next, built by
// coordinator/job_runner.cc) and parsyn-trainer's task file and result (trainer/task.h). No I/O.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/status.h"

namespace parsyn::worker {

// The fields of a coordinator task that the agent acts on, checked once.
struct TaskHeader {
  std::string task_id;
  std::string kind;  // "train" | "evaluate"
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
  int total_rounds = 0;
  int shard = 0;
  int64_t steps_per_round = 0;
};
// InvalidArgument naming the field when one is missing or of the wrong type.
StatusOr<TaskHeader> ParseTaskHeader(const nlohmann::json& task);

// Where the fetched inputs of a task lie on this machine.
struct TaskFiles {
  std::filesystem::path model_dir;       // empty: none (a tabular model created from the data)
  std::filesystem::path global_weights;  // the round's global trainable weights
  std::filesystem::path data;            // training data with the validation rows in it (see validation_fraction)
  std::string data_format;               // "jsonl" | "csv"
  // Replaces the config's validation_fraction: the share of `data` the platform held out for validation.
  std::optional<double> validation_fraction;
  std::filesystem::path output_dir;  // update.safetensors and result.json go here
};

// parsyn-trainer's task: the job config, the task's seed, steps_per_round steps (0 for an evaluate task) on one
// learning-rate schedule that runs across all rounds, the validation slice fixed by split_seed 0 for the job.
// The job config is passed on without "seed" (the task's seed wins) and without an empty label_column or
// hidden_sizes (the trainer's defaults apply).
// InvalidArgument when the task lacks its config.
StatusOr<nlohmann::json> BuildTrainerTask(const nlohmann::json& task, const TaskHeader& header, const TaskFiles& files,
                                          const std::string& device, int threads);

// The body of POST /api/v1/worker/result from the trainer's result (its "done" event). `blob_key` and `sha256`
// describe the uploaded update; empty for an evaluate task. InvalidArgument when `done` lacks a field.
StatusOr<nlohmann::json> BuildResultReport(const TaskHeader& header, const std::string& session_id,
                                           const nlohmann::json& done, const std::string& blob_key,
                                           const std::string& sha256);

// The body of POST /api/v1/worker/progress from a trainer "progress" event; nullopt for other events.
// throughput: tokens per second for language models, else samples per second.
std::optional<nlohmann::json> BuildProgressReport(const TaskHeader& header, const std::string& session_id,
                                                  const nlohmann::json& event, std::optional<double> utilization);

}  // namespace parsyn::worker
