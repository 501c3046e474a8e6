// TrainConfig: a job's training settings in the trainer's types, built from protocol::TrainerConfig, the one schema
// of the job spec's `config` (src/protocol/training_config.h: keys, ranges and defaults are defined there, once) plus
// the trainer-only model_type. A default-constructed TrainConfig holds the job's defaults.
//
// Torch-free on purpose (plain values), so tests and tools can build configs without libtorch.
// Plain value: safe to copy between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "protocol/trainer_task.h"

namespace parsyn::trainer {

using protocol::LrScheduler;
using protocol::LrSchedulerName;
using protocol::MixedPrecision;
using protocol::MixedPrecisionName;
using protocol::TabularModelType;
using protocol::TabularModelTypeName;

struct TrainConfig {
  TrainConfig() : TrainConfig(protocol::TrainerConfig{}) {}
  explicit TrainConfig(const protocol::TrainerConfig& config);

  // How `epochs` and a step budget combine: see StepPlan in train_loop.h (a step budget, when given, wins).
  int64_t epochs;
  int64_t batch_size;                   // examples per micro-batch
  int64_t gradient_accumulation_steps;  // micro-batches per optimizer step
  double learning_rate;
  double weight_decay;   // AdamW decoupled decay; not applied to norms and biases
  int64_t warmup_steps;  // linear warmup from 0 over this many optimizer steps
  LrScheduler lr_scheduler;
  double max_grad_norm;  // 0 disables clipping
  MixedPrecision mixed_precision;
  double validation_fraction;  // share of the data held out for evaluation, in [0, 1)

  // Language models.
  int64_t max_seq_len;  // longer examples are truncated (prompt kept first)
  bool use_peft;        // LoRA adapters instead of full fine-tuning
  int64_t lora_r;
  double lora_alpha;
  double lora_dropout;
  std::vector<std::string> lora_target_modules;

  // Tabular models (CSV data).
  std::optional<TabularModelType> model_type;  // absent: TabularType() decides
  std::vector<int64_t> hidden_sizes;           // mlp only; logreg has none
  std::string label_column;                    // never empty: the job's empty label_column means "label"

  // model_type, or else logreg without hidden layers and mlp with them.
  TabularModelType TabularType() const;
};

// Reads `json` (an object) with the job spec's reader over the job's defaults, plus the trainer-only model_type.
// Errors: InvalidArgument naming every bad key as the job spec does ("config.lora_r (0) must be between 1 and 1024;
// unknown field config.epoch").
StatusOr<TrainConfig> ParseTrainConfig(const nlohmann::json& json);
// Every key, in the spelling ParseTrainConfig reads; ParseTrainConfig(TrainConfigToJson(c)) gives c back.
nlohmann::json TrainConfigToJson(const TrainConfig& config);

}  // namespace parsyn::trainer
