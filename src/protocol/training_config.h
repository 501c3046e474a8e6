// TrainingConfig: a training job's `config` object (POST /api/v1/training-jobs), the one schema that the coordinator's
// job-spec validation, the worker, parsyn-trainer (task files, `parsyn train`) and the dashboard's form defaults use.
// Every default is defined here, once; docs/training.md's table states them.
//
// Fields and defaults (ranges are inclusive):
//   key                          type              default              range / values
//   epochs                       integer           1                    1..1000
//   batch_size                   integer           8                    1..65536
//   learning_rate                number            2e-4                 > 0, <= 10
//   mixed_precision              string            "no"                 "bf16" | "fp16" | "no"
//   use_peft                     boolean           true                 LoRA adapters instead of full fine-tuning
//   lora_r                       integer           16                   1..1024
//   lora_alpha                   number            32                   > 0, <= 65536
//   lora_dropout                 number            0.05                 >= 0, < 1
//   lora_target_modules          array of string   ["q_proj","v_proj"]  1..64 distinct names of [A-Za-z0-9_.], or
//                                                                        "all-linear" (every projection)
//   max_seq_len                  integer           512                  8..131072
//   weight_decay                 number            0                    0..10
//   warmup_steps                 integer           0                    0..10^9
//   lr_scheduler                 string            "linear"             "constant" | "linear" | "cosine"
//   gradient_accumulation_steps  integer           1                    1..1024
//   max_grad_norm                number            1.0                  0..10^6 (0: no clipping)
//   seed                         integer           42                   0..2^53 (the coordinator derives task seeds)
//   validation_fraction          number            0.1                  0..0.5
//   label_column                 string            "" (: "label")       0..128 bytes; tabular CSV: the class column
//   hidden_sizes                 array of integer  [] (: logistic)      0..16 layers of 1..65536 (tabular MLP)
//   trainer                      string            "builtin"            a trainer name (IsTrainerName) the workers
//                                                                        offer (docs/trainer-contract.md)
//
// Errors name the field path and the reason, every problem at once, separated by "; ":
//   "config.lora_r (0) must be between 1 and 1024; unknown field config.lerning_rate".
// Plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace parsyn::protocol {

class FieldReader;

enum class MixedPrecision { kBf16, kFp16, kNo };
enum class LrScheduler { kConstant, kLinear, kCosine };

// The JSON spellings: "bf16", "fp16", "no" / "constant", "linear", "cosine".
std::string_view MixedPrecisionName(MixedPrecision v);
std::string_view LrSchedulerName(LrScheduler v);

// What an empty label_column means: the CSV column named "label".
inline constexpr std::string_view kDefaultLabelColumn = "label";

// The trainer every worker offers (parsyn-trainer, unless the worker maps the name to a command of its own).
inline constexpr std::string_view kBuiltinTrainer = "builtin";
// A trainer's name: 1..64 bytes of [A-Za-z0-9_.-], starting with a letter or digit.
bool IsTrainerName(std::string_view name);

// FedProx's proximal coefficient mu (Li et al., MLSys 2020): a task's and a trainer task's `proximal_mu`, in
// 0..kMaxProximalMu; 0 is plain FedAvg training. The bound keeps a typo (1e9) from freezing the weights silently.
inline constexpr double kMaxProximalMu = 1e6;

struct TrainingConfig {
  int epochs = 1;
  int batch_size = 8;
  double learning_rate = 2e-4;
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  bool use_peft = true;
  int lora_r = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  std::vector<std::string> lora_target_modules = {"q_proj", "v_proj"};
  int max_seq_len = 512;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  LrScheduler lr_scheduler = LrScheduler::kLinear;
  int gradient_accumulation_steps = 1;
  double max_grad_norm = 1.0;
  uint64_t seed = 42;
  double validation_fraction = 0.1;
  std::string label_column;       // empty: kDefaultLabelColumn
  std::vector<int> hidden_sizes;  // empty: no hidden layer (logistic regression)
  std::string trainer = std::string(kBuiltinTrainer);

  // The CSV column holding the class: label_column, or kDefaultLabelColumn when empty.
  std::string LabelColumn() const { return label_column.empty() ? std::string(kDefaultLabelColumn) : label_column; }

  friend bool operator==(const TrainingConfig&, const TrainingConfig&) = default;
};

// Reads the config's keys from `reader` (an object whose path prefix is "config.") over `config`'s values. Leaves
// RejectUnknown to the caller, so that a caller may read keys of its own from the same object first.
void ReadTrainingConfigFields(FieldReader& reader, TrainingConfig& config);

// Reads a `config` object over the defaults; unknown keys are errors. InvalidArgument listing every problem.
StatusOr<TrainingConfig> ParseTrainingConfig(const nlohmann::json& object);

// Every key, defaults filled in; ParseTrainingConfig(TrainingConfigToJson(c)) == c for any c it returned.
nlohmann::json TrainingConfigToJson(const TrainingConfig& config);

}  // namespace parsyn::protocol
