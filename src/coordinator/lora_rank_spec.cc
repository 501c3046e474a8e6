#include "coordinator/lora_rank_spec.h"

#include <algorithm>
#include <charconv>

#include <nlohmann/json.hpp>

#include "protocol/messages.h"

namespace parsyn::coordinator {

using nlohmann::json;

namespace {

constexpr std::pair<std::string_view, LoraAggregation> kLoraAggregations[] = {{"zero_pad", LoraAggregation::kZeroPad},
                                                                              {"svd", LoraAggregation::kSvd}};
constexpr size_t kMaxLoraRankEntries = 10'000;

// A rank in 1..kMaxLoraRank, or nullopt with the problem appended.
std::optional<int> ReadRank(const json& value, const std::string& path, std::vector<std::string>& errors) {
  if (value.is_number_integer()) {
    const int64_t rank = value.get<int64_t>();
    if (rank >= 1 && rank <= protocol::kMaxLoraRank) return static_cast<int>(rank);
  }
  errors.push_back(path + " must be a LoRA rank between 1 and " + std::to_string(protocol::kMaxLoraRank) + ", got " +
                   value.dump().substr(0, 40));
  return std::nullopt;
}

// A worker id written as a JSON object key: decimal digits, >= 1.
std::optional<int64_t> ParseWorkerKey(const std::string& key) {
  int64_t id = 0;
  auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec != std::errc() || end != key.data() + key.size() || id < 1 || key.front() == '+') return std::nullopt;
  return id;
}

void TakeLoraRanks(const json& ranks, LoraRankSpec& spec, std::vector<std::string>& errors) {
  if (!ranks.is_object() || ranks.empty()) {
    errors.push_back(
        "config.lora_ranks must be an object of ranks by worker id, e.g. {\"3\": 16, \"default\": 4}, got " +
        ranks.dump().substr(0, 40));
    return;
  }
  if (ranks.size() > kMaxLoraRankEntries) {
    errors.push_back("config.lora_ranks names more than " + std::to_string(kMaxLoraRankEntries) + " workers");
    return;
  }
  for (const auto& [key, value] : ranks.items()) {
    const std::string path = "config.lora_ranks." + key;
    std::optional<int> rank = ReadRank(value, path, errors);
    if (key == "default") {
      spec.default_rank = rank;
    } else if (std::optional<int64_t> id = ParseWorkerKey(key)) {
      if (rank) spec.by_worker[*id] = *rank;
    } else {
      errors.push_back("config.lora_ranks keys must be worker ids (\"3\") or \"default\", got \"" + key.substr(0, 40) +
                       "\"");
    }
  }
}

}  // namespace

std::string_view LoraAggregationName(LoraAggregation v) {
  for (const auto& [name, value] : kLoraAggregations) {
    if (value == v) return name;
  }
  return "?";
}

void TakeLoraRankFields(json& config, LoraRankSpec& spec, std::vector<std::string>& errors) {
  if (!config.is_object()) return;  // the config reader says so
  if (auto r = config.find("lora_r"); r != config.end() && r->is_string()) {
    if (*r == "auto") {
      spec.auto_rank = true;
      config.erase(r);
    }  // another string: TrainingConfig's reader says lora_r must be an integer
  }
  if (auto max = config.find("lora_r_max"); max != config.end()) {
    if (!max->is_null()) {
      if (!spec.auto_rank) {
        errors.push_back("config.lora_r_max applies only to config.lora_r \"auto\" (it caps the automatic ranks)");
      } else if (std::optional<int> rank = ReadRank(*max, "config.lora_r_max", errors)) {
        spec.auto_max_rank = *rank;
      }
    }
    config.erase(max);
  }
  if (auto ranks = config.find("lora_ranks"); ranks != config.end()) {
    if (!ranks->is_null()) TakeLoraRanks(*ranks, spec, errors);
    config.erase(ranks);
  }
  if (auto aggregation = config.find("lora_aggregation"); aggregation != config.end()) {
    if (!aggregation->is_null()) {
      bool known = false;
      for (const auto& [name, value] : kLoraAggregations) {
        if (aggregation->is_string() && *aggregation == name) {
          spec.aggregation = value;
          known = true;
        }
      }
      if (!known) {
        errors.push_back("config.lora_aggregation must be one of \"svd\", \"zero_pad\", got " +
                         aggregation->dump().substr(0, 40));
      }
    }
    config.erase(aggregation);
  }
}

void FinishLoraRanks(LoraRankSpec& spec, protocol::TrainingConfig& config, strategy::StrategyKind strategy,
                     const std::vector<int64_t>& selected_workers, std::vector<std::string>& errors) {
  const bool given = spec.mixed() || spec.aggregation.has_value();
  if (given && !config.use_peft) {
    errors.push_back(
        "config.lora_r \"auto\", config.lora_ranks and config.lora_aggregation need config.use_peft true (they "
        "set LoRA ranks)");
    return;
  }
  if (spec.auto_rank && spec.default_rank) {
    errors.push_back(
        "config.lora_ranks.default cannot be given with config.lora_r \"auto\": the workers lora_ranks does not name "
        "get the automatic rank");
  }
  if (!selected_workers.empty()) {
    for (const auto& [id, rank] : spec.by_worker) {
      if (std::find(selected_workers.begin(), selected_workers.end(), id) == selected_workers.end()) {
        errors.push_back("config.lora_ranks names worker " + std::to_string(id) +
                         ", which is not in this job's worker_selection; name one of its workers or \"default\"");
      }
    }
  }
  const bool averages =
      strategy == strategy::StrategyKind::kFederatedAveraging || strategy == strategy::StrategyKind::kFedProx;
  if (spec.EffectiveAggregation() == LoraAggregation::kSvd && !averages) {
    errors.push_back(
        "config.lora_aggregation \"svd\"" + std::string(spec.aggregation ? "" : " (the default with mixed ranks)") +
        " needs distributed.strategy federated_averaging or fedprox, whose new global is the updates' "
        "weighted mean; with " +
        std::string(strategy::StrategyKindName(strategy)) + " set config.lora_aggregation to \"zero_pad\"");
  }
  // Normalised: config.lora_r is the global's rank r_max; the unnamed workers' rank is default_rank.
  if (!spec.auto_rank && !spec.by_worker.empty() && !spec.default_rank) spec.default_rank = config.lora_r;
  int max_rank = spec.auto_rank ? spec.auto_max_rank : config.lora_r;
  if (spec.default_rank) max_rank = std::max(max_rank, *spec.default_rank);
  for (const auto& [id, rank] : spec.by_worker) max_rank = std::max(max_rank, rank);
  config.lora_r = max_rank;
}

void LoraRanksToConfigJson(const LoraRankSpec& spec, json& config) {
  if (spec.auto_rank) {
    config["lora_r"] = "auto";
    config["lora_r_max"] = spec.auto_max_rank;
  }
  if (!spec.by_worker.empty() || spec.default_rank) {
    json ranks = json::object();
    for (const auto& [id, rank] : spec.by_worker) ranks[std::to_string(id)] = rank;
    if (spec.default_rank) ranks["default"] = *spec.default_rank;
    config["lora_ranks"] = std::move(ranks);
  }
  if (spec.aggregation) config["lora_aggregation"] = LoraAggregationName(*spec.aggregation);
}

int AutoLoraRank(int max_rank, std::optional<int64_t> device_memory_bytes, int64_t model_bytes) {
  if (!device_memory_bytes || *device_memory_bytes <= 0 || model_bytes <= 0) return max_rank;
  const double q = static_cast<double>(*device_memory_bytes) / static_cast<double>(model_bytes);
  const int divisor = q >= 8 ? 1 : q >= 4 ? 2 : q >= 2 ? 4 : 8;
  return std::max(1, max_rank / divisor);
}

StatusOr<int> WorkerLoraRank(const LoraRankSpec& spec, int max_rank, int64_t worker_id,
                             std::optional<int64_t> device_memory_bytes, std::optional<int> announced_lora_rank,
                             int64_t model_bytes) {
  std::optional<int> set_by_job;
  if (auto named = spec.by_worker.find(worker_id); named != spec.by_worker.end()) {
    set_by_job = named->second;
  } else if (spec.default_rank) {
    set_by_job = spec.default_rank;
  } else if (!spec.auto_rank) {
    set_by_job = max_rank;
  }
  if (!set_by_job) {
    const int automatic = AutoLoraRank(max_rank, device_memory_bytes, model_bytes);
    return announced_lora_rank ? std::min(automatic, *announced_lora_rank) : automatic;
  }
  if (announced_lora_rank && *set_by_job > *announced_lora_rank) {
    return FailedPreconditionError(
        "worker " + std::to_string(worker_id) + " announces it trains LoRA ranks up to " +
        std::to_string(*announced_lora_rank) + " (parsyn worker --lora-rank), and this job " + "gives it rank " +
        std::to_string(*set_by_job) + ": lower its rank in config.lora_ranks, or restart the worker with --lora-rank " +
        std::to_string(*set_by_job));
  }
  return *set_by_job;
}

}  // namespace parsyn::coordinator
