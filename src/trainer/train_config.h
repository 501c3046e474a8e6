// TrainConfig: the training settings of a job, with the same keys as the job spec's `config` object
// (docs/product-spec.md), parsed strictly: an unknown key or a value of the wrong type or range is
// InvalidArgument naming the key, so a typo never silently trains with a default.
//
// Torch-free on purpose (plain values), so tests and tools can build configs without libtorch.
// Plain value: safe to copy between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace parsyn::trainer {

enum class MixedPrecision { kNo, kBf16, kFp16 };
enum class LrScheduler { kConstant, kLinear, kCosine };
enum class TabularModelType { kMlp, kLogreg };

// "no", "bf16", "fp16" / "constant", "linear", "cosine" / "mlp", "logreg".
std::string_view MixedPrecisionName(MixedPrecision value);
std::string_view LrSchedulerName(LrScheduler value);
std::string_view TabularModelTypeName(TabularModelType value);

struct TrainConfig {
  // How `epochs` and a step budget combine: see StepPlan in train_loop.h (a step budget, when given, wins).
  int64_t epochs = 1;
  int64_t batch_size = 8;                   // examples per micro-batch
  int64_t gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  double learning_rate = 2e-4;
  double weight_decay = 0.0;  // AdamW decoupled decay; not applied to norms and biases
  int64_t warmup_steps = 0;   // linear warmup from 0 over this many optimizer steps
  LrScheduler lr_scheduler = LrScheduler::kLinear;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  double validation_fraction = 0.1;  // share of the data held out for evaluation, in [0, 1)

  // Language models.
  int64_t max_seq_len = 512;  // longer examples are truncated (prompt kept first)
  bool use_peft = false;      // LoRA adapters instead of full fine-tuning
  int64_t lora_r = 8;
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_target_modules = {"q_proj", "v_proj"};

  // Tabular models (CSV data).
  TabularModelType model_type = TabularModelType::kMlp;
  std::vector<int64_t> hidden_sizes = {64};  // mlp only; logreg has none
  std::string label_column = "label";
};

// Reads `json` (an object) over the defaults above; keys as the spec spells them. `mixed_precision` also accepts
// "fp32" and "none" for "no". Errors: InvalidArgument "config.<key>: <what is wrong>" (unknown key, wrong type, out of
// range: batch_size >= 1, epochs >= 1, learning_rate > 0, lora_r >= 1, 0 <= lora_dropout < 1, ...).
StatusOr<TrainConfig> ParseTrainConfig(const nlohmann::json& json);
// Every key, in the spelling ParseTrainConfig reads; ParseTrainConfig(TrainConfigToJson(c)) == c.
nlohmann::json TrainConfigToJson(const TrainConfig& config);

}  // namespace parsyn::trainer
