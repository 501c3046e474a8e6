// The trainer's task file: what the worker (or `parsyn train`) writes and a trainer reads (`parsyn-trainer run
// TASK.json`, or any trainer of the trainer contract: docs/trainer-contract.md, which documents every field).
//
//   {
//     "contract_version": 1,                 // the trainer contract's version (trainer_events.h); absent reads as 1
//     "kind": "train",                       // "train" | "evaluate"; absent: "evaluate" when steps is 0, else "train"
//     "model_kind": "llama",                 // optional: "llama", "qwen2", "tabular-mlp", "custom", ... (the job's)
//     "model_dir": "models/tiny",            // optional. Language model: Hugging Face-style folder (config.json,
//                                            //   weights, tokenizer.json); tabular: a folder with tabular_model.json,
//                                            //   or absent to create a new model from the data and config
//     "initial_weights": "global.safetensors",  // optional: trainable weights to start from
//     "data": "shard.jsonl",                 // .jsonl → language model; .csv → tabular ("data_format" overrides)
//     "validation_data": "validation.jsonl", // optional: the validation rows; absent: validation_fraction of data
//     "data_format": "jsonl",                // optional: "jsonl" | "csv"
//     "config": {...},                       // the job's config (training_config.h), plus the trainer-only key
//                                            //   model_type; its seed is not used (the task's seed is)
//     "validation_fraction": 0.25,           // optional, [0, 1): replaces config.validation_fraction (the share of
//                                            //   the data the platform held out, which may exceed the config's 0.5)
//     "steps": 500,                          // optional step budget (wins over epochs); 0 = evaluate only
//     "seed": 7,                             // 0..2^63-1: shuffling, dropout, new-model and LoRA initialisation
//     "split_seed": 0,                       // optional (default 0): the validation slice, stable across rounds
//     "schedule": {"start_step": 0, "total_steps": 5000},  // optional: continue one LR schedule across rounds
//     "proximal_mu": 0.01,                   // optional (default 0), 0..1e6: FedProx's mu; the loss gets
//                                            //   mu/2 * ||w - w_start||^2 over the trainable weights, w_start being
//                                            //   them as this run starts (the round's global); 0: plain training
//     "device": "cpu",                       // optional (default "cpu"): "cpu" | "cuda" | "cuda:N"
//     "threads": 0,                          // optional: intra-op threads (0 = libtorch's default)
//     "output": {
//       "weights": "out/update.safetensors", // the trained trainable weights (adapters only when LoRA)
//       "result": "out/result.json",
//       "model_dir": "out/model"             // optional: a loadable folder (PEFT adapter, full model, tabular model)
//     }
//   }
//
// Paths are kept as written; the trainer resolves relative ones against the task file's folder. Unknown keys are
// errors; every problem is reported at once with its path ("task.data is required; config.lora_r (0) must be ...").
// Plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "protocol/messages.h"
#include "protocol/training_config.h"

namespace parsyn::protocol {

enum class TabularModelType { kMlp, kLogreg };
std::string_view TabularModelTypeName(TabularModelType v);  // "mlp" | "logreg"

// The trainer's config: the job's keys plus model_type, which only the trainer reads (`parsyn train --model-type`,
// `parsyn model init --architecture`): the architecture of a new tabular model. Absent, it follows the job's
// hidden_sizes: logreg when empty, else mlp.
struct TrainerConfig {
  TrainingConfig training;
  std::optional<TabularModelType> model_type;

  TabularModelType TabularType() const {
    return model_type.value_or(training.hidden_sizes.empty() ? TabularModelType::kLogreg : TabularModelType::kMlp);
  }

  friend bool operator==(const TrainerConfig&, const TrainerConfig&) = default;
};

// Reads a config object (paths "config.<key>"); unknown keys are errors. InvalidArgument listing every problem.
StatusOr<TrainerConfig> ParseTrainerConfig(const nlohmann::json& object);
// Every key of the job's config, and model_type when set.
nlohmann::json TrainerConfigToJson(const TrainerConfig& config);

struct TrainerSchedule {
  int64_t start_step = 0;
  std::optional<int64_t> total_steps;  // >= 1; absent: the run's own steps

  friend bool operator==(const TrainerSchedule&, const TrainerSchedule&) = default;
};

struct TrainerTask {
  int contract_version = 1;  // always kTrainerContractVersion once parsed
  TaskKind kind = TaskKind::kTrain;
  std::string model_kind;       // empty: not said
  std::string model_dir;        // empty: none
  std::string initial_weights;  // empty: none
  std::string data;
  std::string validation_data;  // empty: held out of `data` (validation_fraction, split_seed)
  std::string data_format;      // "jsonl" | "csv"; empty: by the data file's extension
  TrainerConfig config;
  std::optional<double> validation_fraction;
  std::optional<int64_t> steps;
  uint64_t seed = 0;
  uint64_t split_seed = 0;
  std::optional<TrainerSchedule> schedule;
  double proximal_mu = 0;  // 0..kMaxProximalMu; 0 is left out of the JSON
  std::string device = "cpu";
  int64_t threads = 0;
  std::string output_weights;
  std::string output_result;
  std::string output_model_dir;  // empty: none

  // validation_fraction when given, else the config's.
  double ValidationFraction() const { return validation_fraction.value_or(config.training.validation_fraction); }

  friend bool operator==(const TrainerTask&, const TrainerTask&) = default;
};

// OK when the task object's contract_version is absent or kTrainerContractVersion; else InvalidArgument
// "task.contract_version 999 is not supported: this trainer reads version 1" (a trainer answers it with the error
// code kUnsupportedContractVersion). Checked by ParseTrainerTask too.
Status CheckTrainerContractVersion(const nlohmann::json& object);

// InvalidArgument listing every problem, each with its path ("task.output.result is required").
StatusOr<TrainerTask> ParseTrainerTask(const nlohmann::json& object);
// ParseTrainerTask(TrainerTaskToJson(t)) == t for any t it returned; optional fields that are unset are left out.
nlohmann::json TrainerTaskToJson(const TrainerTask& task);

}  // namespace parsyn::protocol
