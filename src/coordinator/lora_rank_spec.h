// LoraRankSpec: a LoRA job's ranks when its workers may train different ones (docs/training.md "Workers of different
// ranks"), read from the job's config object beside TrainingConfig, and the rules that give each worker its rank.
//
//   field                    type                 default            meaning
//   config.lora_r            integer or "auto"    16                 "auto": each worker's rank from its announced
//                                                                    memory and the model's size (AutoLoraRank)
//   config.lora_r_max        integer              16                 "auto" only: the highest rank, 1..1024
//   config.lora_ranks        object               absent             {"<worker id>": rank, "default": rank}: the
//                                                                    rank of each named worker; the others train
//                                                                    "default", else config.lora_r (or "auto")
//   config.lora_aggregation  string               "svd" with mixed   "svd" | "zero_pad": how updates of different
//                                                 ranks, else        ranks combine (weights/lora_rank.h)
//                                                 "zero_pad"
//
// The global adapter has the job's largest rank r_max: config.lora_r_max with "auto" (or a larger rank lora_ranks
// names), else the largest of config.lora_r and lora_ranks' values. The normalised spec holds r_max in
// TrainingConfig::lora_r (what the global's layout, the initial adapters and adapter_config.json read), the rank of
// workers lora_ranks does not name in `default_rank`; its JSON writes lora_r "auto" back for auto jobs, and
// lora_ranks with its "default" filled in, so that it parses back to itself.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "protocol/training_config.h"
#include "strategy/strategy_options.h"

namespace parsyn::coordinator {

// config.lora_aggregation: "svd" (the exact weighted mean of the updates' products B·A, truncated to r_max, computed
// in factored form) or "zero_pad" (each update's factors padded with zeros to r_max, then averaged as any weights).
enum class LoraAggregation { kZeroPad, kSvd };
std::string_view LoraAggregationName(LoraAggregation v);

inline constexpr int kDefaultAutoMaxLoraRank = 16;

struct LoraRankSpec {
  bool auto_rank = false;                       // config.lora_r "auto"
  int auto_max_rank = kDefaultAutoMaxLoraRank;  // config.lora_r_max
  std::map<int64_t, int> by_worker;             // config.lora_ranks' worker ids
  // The rank of workers lora_ranks does not name: its "default", else config.lora_r as given; absent for a job
  // without lora_ranks (every worker trains config.lora_r) and for "auto" (they get AutoLoraRank).
  std::optional<int> default_rank;
  std::optional<LoraAggregation> aggregation;  // as given

  // Whether workers may train different ranks.
  bool mixed() const { return auto_rank || !by_worker.empty() || default_rank.has_value(); }
  LoraAggregation EffectiveAggregation() const {
    return aggregation.value_or(mixed() ? LoraAggregation::kSvd : LoraAggregation::kZeroPad);
  }

  friend bool operator==(const LoraRankSpec&, const LoraRankSpec&) = default;
};

// Reads lora_r (when "auto"), lora_r_max, lora_ranks and lora_aggregation out of `config` (a copy of the job's config
// object, which TrainingConfig's reader then reads: these keys are erased from it), appending each problem to
// `errors` with its field path.
void TakeLoraRankFields(nlohmann::json& config, LoraRankSpec& spec, std::vector<std::string>& errors);

// Once TrainingConfig is read: the cross-field rules (LoRA only; svd only with a strategy whose new global is the
// updates' weighted mean; lora_ranks' workers among those worker_selection lists, when it lists any) and the
// normalisation above (config.lora_r becomes r_max).
void FinishLoraRanks(LoraRankSpec& spec, protocol::TrainingConfig& config, strategy::StrategyKind strategy,
                     const std::vector<int64_t>& selected_workers, std::vector<std::string>& errors);

// Writes the spec's fields into the job's config JSON (TrainingConfigToJson's output): lora_r "auto" and lora_r_max
// for auto jobs, lora_ranks and lora_aggregation when there are any.
void LoraRanksToConfigJson(const LoraRankSpec& spec, nlohmann::json& config);

// config.lora_r "auto": the rank for a worker whose device has `device_memory_bytes`, for a model of `model_bytes`.
// With q = memory / model bytes: q >= 8 trains r_max, q >= 4 r_max / 2, q >= 2 r_max / 4, else r_max / 8, never
// below 1. Memory or model size unknown (absent, 0): r_max.
int AutoLoraRank(int max_rank, std::optional<int64_t> device_memory_bytes, int64_t model_bytes);

// The rank a worker trains in a job whose global has rank `max_rank` (config.lora_r once normalised): lora_ranks'
// for it, else the default rank, else AutoLoraRank (auto jobs) or max_rank — at most what the worker announced
// (`announced_lora_rank`, parsyn worker --lora-rank) for "auto". FailedPrecondition naming both numbers when a rank
// the job sets for it exceeds what it announced.
StatusOr<int> WorkerLoraRank(const LoraRankSpec& spec, int max_rank, int64_t worker_id,
                             std::optional<int64_t> device_memory_bytes, std::optional<int> announced_lora_rank,
                             int64_t model_bytes);

}  // namespace parsyn::coordinator
