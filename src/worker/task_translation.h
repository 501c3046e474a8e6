// Pure translations between the coordinator's task (protocol::Task, GET /api/v1/worker/tasks/next) and a trainer's
// task file (protocol::TrainerTask, docs/trainer-contract.md), and from the trainer's result and progress events to the
// worker's reports (protocol::Result, protocol::Progress). No I/O.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/status.h"
#include "protocol/messages.h"
#include "protocol/trainer_events.h"
#include "protocol/trainer_task.h"

namespace parsyn::worker {

// Where the fetched inputs of a task lie on this machine.
struct TaskFiles {
  std::filesystem::path model_dir;        // empty: none (a tabular model created from the data)
  std::filesystem::path global_weights;   // the round's global trainable weights
  std::filesystem::path data;             // the training rows (a platform shard's), or the worker's own file
  std::filesystem::path validation_data;  // a platform shard's validation rows; empty: held out of `data`
  std::string data_format;                // "jsonl" | "csv"
  std::filesystem::path output_dir;       // update.safetensors and result.json go here
};

// The trainer's task: its kind and the job's model kind, the job's config as the coordinator sent it, the task's seed,
// steps_per_round steps (none for an evaluate task) on one learning-rate schedule that runs across all rounds, the
// shard's validation file, or for the worker's own file (data_source "workers") the config's validation fraction held
// out by the job's config.seed, the same rows every round. A job of steps_per_round 0 trains config.epochs passes per
// round, without a step budget. A train task's proximal_mu (FedProx) goes with it.
protocol::TrainerTask BuildTrainerTask(const protocol::Task& task, const TaskFiles& files, const std::string& device,
                                       int threads);

// The POST /api/v1/worker/result body from the trainer's checked result. `blob_key` and `sha256` describe the
// uploaded update; empty for an evaluate task.
protocol::Result BuildResult(const protocol::Task& task, const std::string& session_id,
                             const protocol::TrainerResult& result, const std::string& blob_key,
                             const std::string& sha256);

// A train task's update as it travels: the job's distributed.compression applied to the trainer's update file
// (docs/compression.md, "In jobs"), written beside it as update.wire; a job without compression keeps the file as it
// is. `sha256` is then of the bytes that travel. Error feedback keeps its residual in `state_dir`, one file per job.
struct WireUpdate {
  std::filesystem::path file;
  std::string sha256;
};
StatusOr<WireUpdate> EncodeUpdateForJob(const protocol::Task& task, const std::filesystem::path& update_file,
                                        const std::string& update_sha256, const std::filesystem::path& global_file,
                                        const std::filesystem::path& state_dir);

// The POST /api/v1/worker/progress body from a trainer's progress event.
protocol::Progress BuildProgress(const protocol::Task& task, const std::string& session_id,
                                 const protocol::TrainerProgress& event, std::optional<double> utilization);

}  // namespace parsyn::worker
