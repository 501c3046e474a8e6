// One training task, as the worker (or `parsyn train`) hands it to `parsyn-trainer`: a JSON file whose format,
// reader and writer are protocol::TrainerTask (src/protocol/trainer_task.h); its config is the job's (one schema,
// src/protocol/training_config.h) plus the trainer-only model_type.
//
// Result JSON (written only on success): the trainer contract's result (protocol::TrainerResult: num_samples,
// num_validation, train_loss, validation_before, validation_after, metrics {steps, examples_seen, tokens_seen,
// wall_s}), plus this trainer's own keys "kind": "language_model"|"tabular", "weights": path, "weights_sha256": hex.
// Validation metrics: num_examples, num_counted, loss, perplexity, accuracy, exact_match.
//
// Used from one thread; `stop` may be requested from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "protocol/messages.h"
#include "protocol/trainer_task.h"

namespace parsyn::trainer {

struct TrainTask {
  protocol::TaskKind kind = protocol::TaskKind::kTrain;  // evaluate: steps is 0
  std::filesystem::path model_dir;                       // empty: none given
  std::filesystem::path initial_weights;
  std::filesystem::path data;
  std::filesystem::path validation_data;  // empty: validation_fraction of data is held out by split_seed
  std::string data_format;                // "jsonl" or "csv"
  protocol::TrainerConfig config;         // training.validation_fraction: the task's when it gives one
  std::optional<int64_t> steps;
  uint64_t seed = 0;
  uint64_t split_seed = 0;
  int64_t schedule_start_step = 0;
  std::optional<int64_t> schedule_total_steps;
  double proximal_mu = 0;  // FedProx's mu (TrainOptions::proximal_mu); 0: plain training
  std::string device = "cpu";
  int64_t threads = 0;
  std::filesystem::path output_weights;
  std::filesystem::path output_result;
  std::filesystem::path output_model_dir;  // empty: none
};

// Parses a task (protocol::ParseTrainerTask). Relative paths are taken relative to `base_dir` (the task file's
// folder); the task's validation_fraction, when given, replaces the config's. InvalidArgument naming every field that
// is missing or malformed (unknown keys too).
StatusOr<TrainTask> ParseTrainTask(const nlohmann::json& json, const std::filesystem::path& base_dir);
StatusOr<TrainTask> ReadTrainTaskFile(const std::filesystem::path& path);

// Receives each event as one JSON object: {"event": "progress", "step", "total_steps", "loss", "throughput",
// "throughput_unit" (protocol::TrainerProgress), and "epoch", "lr", "grad_norm", "skipped"}, {"event": "eval", "phase":
// "before"|"after", metrics...},
// {"event": "start", "kind", "samples_used", "num_validation", "total_steps", "trainable_parameters"}.
using TaskEventSink = std::function<void(const nlohmann::json& event)>;

// Runs the task: load data and model, evaluate the received weights on the validation slice, train, evaluate again,
// write the outputs. Returns the result JSON (also written to output.result). Errors: InvalidArgument (bad data,
// naming the line; bad weights; bad config), NotFound (missing files), ResourceExhausted (out of memory), Cancelled
// (stop requested), Internal (libtorch failure).
StatusOr<nlohmann::json> RunTrainTask(const TrainTask& task, const TaskEventSink& on_event, std::stop_token stop);

}  // namespace parsyn::trainer
