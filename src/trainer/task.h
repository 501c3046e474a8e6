// One training task, as the worker (or `parsyn train`) hands it to `parsyn-trainer`: a JSON file
//
//   {
//     "model_dir": "models/tiny",            // language model: Hugging Face-style folder (config.json, weights,
//                                            //   tokenizer.json); tabular: a folder with tabular_model.json, or
//                                            //   absent to create a new model from the data and config
//     "initial_weights": "global.safetensors",  // optional: trainable weights to start from (LoRA adapters with
//                                            //   PEFT names when use_peft; else all trainable weights)
//     "data": "shard.jsonl",                 // .jsonl → language model; .csv → tabular ("data_format" overrides)
//     "data_format": "jsonl",                // optional: "jsonl" | "csv"
//     "config": {...},                       // the job spec's config keys (train_config.h)
//     "steps": 500,                          // optional step budget (wins over epochs); 0 = evaluate only
//     "seed": 7,                             // shuffling, dropout, new-model and LoRA initialisation
//     "split_seed": 0,                       // optional (default 0): the validation slice, stable across rounds
//     "schedule": {"start_step": 0, "total_steps": 5000},  // optional: continue one LR schedule across rounds
//     "device": "cpu",                       // "cpu" | "cuda" | "cuda:N"
//     "threads": 0,                          // optional: intra-op threads (0 = libtorch's default)
//     "output": {
//       "weights": "out/update.safetensors", // the trained trainable weights (adapters only when LoRA)
//       "result": "out/result.json",
//       "model_dir": "out/model"             // optional: a loadable folder — PEFT adapter (adapter_config.json +
//                                            //   adapter_model.safetensors), full model folder, or tabular model
//     }
//   }
//
// Result JSON (written only on success): {"status": "ok", "kind": "language_model"|"tabular", "samples_used": N
// (training examples in the data, after the validation slice), "num_validation": M, "steps", "examples_seen",
// "tokens_seen", "mean_train_loss", "wall_s", "validation_before": {metrics} | null, "validation_after": {metrics}
// | null, "weights": path, "weights_sha256": hex}. Metrics: num_examples, loss, perplexity, accuracy, exact_match.
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
#include "trainer/train_config.h"

namespace parsyn::trainer {

struct TrainTask {
  std::filesystem::path model_dir;  // empty: none given
  std::filesystem::path initial_weights;
  std::filesystem::path data;
  std::string data_format;  // "jsonl" or "csv"
  TrainConfig config;
  std::optional<int64_t> steps;
  uint64_t seed = 0;
  uint64_t split_seed = 0;
  int64_t schedule_start_step = 0;
  std::optional<int64_t> schedule_total_steps;
  std::string device = "cpu";
  int64_t threads = 0;
  std::filesystem::path output_weights;
  std::filesystem::path output_result;
  std::filesystem::path output_model_dir;  // empty: none
};

// Parses a task. Relative paths are taken relative to `base_dir` (the task file's folder). InvalidArgument naming the
// field for anything missing or malformed (unknown keys too).
StatusOr<TrainTask> ParseTrainTask(const nlohmann::json& json, const std::filesystem::path& base_dir);
StatusOr<TrainTask> ReadTrainTaskFile(const std::filesystem::path& path);

// Receives each event as one JSON object: {"event": "progress", "step", "total_steps", "epoch", "loss", "lr",
// "grad_norm", "tokens_per_s", "samples_per_s"}, {"event": "eval", "phase": "before"|"after", metrics...},
// {"event": "start", "kind", "samples_used", "num_validation", "total_steps", "trainable_parameters"}.
using TaskEventSink = std::function<void(const nlohmann::json& event)>;

// Runs the task: load data and model, evaluate the received weights on the validation slice, train, evaluate again,
// write the outputs. Returns the result JSON (also written to output.result). Errors: InvalidArgument (bad data,
// naming the line; bad weights; bad config), NotFound (missing files), ResourceExhausted (out of memory), Cancelled
// (stop requested), Internal (libtorch failure).
StatusOr<nlohmann::json> RunTrainTask(const TrainTask& task, const TaskEventSink& on_event, std::stop_token stop);

}  // namespace parsyn::trainer
