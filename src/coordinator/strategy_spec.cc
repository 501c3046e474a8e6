#include "coordinator/strategy_spec.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"
#include "strategy/make_strategy.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using protocol::FieldReader;
using strategy::StrategyKind;
using strategy::StrategyOptions;

constexpr std::string_view kAllOptions[] = {"mu",
                                            "server_learning_rate",
                                            "server_momentum",
                                            "beta1",
                                            "beta2",
                                            "tau",
                                            "beta",
                                            "f",
                                            "m",
                                            "clip_norm",
                                            "noise_multiplier",
                                            "delta"};

bool Takes(StrategyKind kind, std::string_view option) {
  const auto names = strategy::StrategyOptionNames(kind);
  return std::find(names.begin(), names.end(), option) != names.end();
}

std::string TakenList(StrategyKind kind) {
  std::string list;
  for (std::string_view name : strategy::StrategyOptionNames(kind)) list += std::string(name) + ", ";
  return list + "sample_fraction, sample_count";
}

}  // namespace

void ParseStrategyOptions(const json* object, StrategyKind kind, StrategyOptions& o, std::vector<std::string>& errors) {
  o = strategy::DefaultStrategyOptions(kind);
  const bool has_clip_norm = object != nullptr && object->contains("clip_norm") && !(*object)["clip_norm"].is_null();
  if (strategy::StrategyOptionRequired(kind, "clip_norm") && !has_clip_norm) {
    errors.push_back(
        "distributed.strategy_options.clip_norm is required for dp_fedavg: the L2 bound each update is clipped to "
        "(the noise is noise_multiplier * clip_norm), e.g. 1.0");
  }
  if (object == nullptr) return;
  FieldReader r(*object, "distributed.strategy_options.", errors);
  const std::string kind_name(strategy::StrategyKindName(kind));
  for (std::string_view option : kAllOptions) {
    if (Takes(kind, option) || r.Get(option) == nullptr) continue;
    r.Error(r.Path(option) + ": " + kind_name + " does not take " + std::string(option) + "; it takes " +
            TakenList(kind));
  }
  auto read = [&](std::string_view option, double& out, double min, double max, bool min_exclusive,
                  bool max_exclusive) {
    if (Takes(kind, option)) r.Number(option, out, min, max, min_exclusive, max_exclusive);
  };
  read("mu", o.mu, 0, 1e4, false, false);
  read("server_learning_rate", o.server_learning_rate, 0, 1e3, true, false);
  read("server_momentum", o.server_momentum, 0, 1, false, true);
  read("beta1", o.beta1, 0, 1, false, true);
  read("beta2", o.beta2, 0, 1, false, true);
  read("tau", o.tau, 0, 10, true, false);
  read("beta", o.beta, 0, 0.5, false, true);
  if (Takes(kind, "f")) r.Integer("f", o.f, 0, 499);
  if (Takes(kind, "m") && r.Get("m") != nullptr) {
    int m = 1;
    r.Integer("m", m, 1, 1000);
    o.m = m;
  }
  read("clip_norm", o.clip_norm, 0, 1e6, true, false);
  read("noise_multiplier", o.noise_multiplier, 0, 1e3, true, false);
  read("delta", o.delta, 0, 1, true, true);

  const bool fraction_given = r.Get("sample_fraction") != nullptr;
  const bool count_given = r.Get("sample_count") != nullptr;
  if (fraction_given && count_given) {
    r.Error(
        "distributed.strategy_options.sample_count: give sample_fraction or sample_count, not both (each chooses "
        "how many workers train per round)");
  } else if (fraction_given) {
    double fraction = 1;
    const size_t before = errors.size();
    r.Number("sample_fraction", fraction, 0, 1, true, false);
    if (errors.size() == before) o.sampling.fraction = fraction;
  } else if (count_given) {
    int count = 1;
    const size_t before = errors.size();
    r.Integer("sample_count", count, 1, 1000);
    if (errors.size() == before) o.sampling.count = count;
  }
  r.RejectUnknown();
}

void CheckStrategyRules(StrategyKind kind, const StrategyOptions& o, bool distributed, int min_workers, int max_workers,
                        std::vector<std::string>& errors) {
  const std::string kind_name(strategy::StrategyKindName(kind));
  // The parser already checked each option's range; this catches a rule of the strategy class it does not know.
  if (auto made = strategy::MakeStrategy(kind, o, weights::SecretKey{}); !made.ok() && errors.empty()) {
    errors.push_back("distributed.strategy_options: " + kind_name + ": " + std::string(made.status().message()));
  }
  if (!distributed) return;  // one worker, one round: the round-size rules do not apply
  if (kind == StrategyKind::kKrum || kind == StrategyKind::kMultiKrum) {
    if (min_workers < 2 * o.f + 3) {
      errors.push_back("distributed.min_workers (" + std::to_string(min_workers) + ") must be >= 2f + 3 = " +
                       std::to_string(2 * o.f + 3) + " for " + kind_name + " with distributed.strategy_options.f " +
                       std::to_string(o.f) + ": Krum scores each update against its n - f - 2 nearest others");
    }
    if (kind == StrategyKind::kMultiKrum && o.m && *o.m > min_workers - o.f) {
      errors.push_back("distributed.strategy_options.m (" + std::to_string(*o.m) + ") must be <= min_workers - f (" +
                       std::to_string(min_workers - o.f) + "): multi_krum averages m of the n - f best updates");
    }
  }
  if (o.sampling.count && (*o.sampling.count < min_workers || *o.sampling.count > max_workers)) {
    errors.push_back("distributed.strategy_options.sample_count (" + std::to_string(*o.sampling.count) +
                     ") must be between distributed.min_workers (" + std::to_string(min_workers) +
                     ") and distributed.max_workers (" + std::to_string(max_workers) + ")");
  }
}

json StrategyOptionsToJson(StrategyKind kind, const StrategyOptions& o) {
  json out = json::object();
  for (std::string_view option : strategy::StrategyOptionNames(kind)) {
    const std::string key(option);
    if (option == "mu") out[key] = o.mu;
    if (option == "server_learning_rate") out[key] = o.server_learning_rate;
    if (option == "server_momentum") out[key] = o.server_momentum;
    if (option == "beta1") out[key] = o.beta1;
    if (option == "beta2") out[key] = o.beta2;
    if (option == "tau") out[key] = o.tau;
    if (option == "beta") out[key] = o.beta;
    if (option == "f") out[key] = o.f;
    if (option == "m") out[key] = o.m ? json(*o.m) : json(nullptr);
    if (option == "clip_norm") out[key] = o.clip_norm;
    if (option == "noise_multiplier") out[key] = o.noise_multiplier;
    if (option == "delta") out[key] = o.delta;
  }
  if (o.sampling.fraction) out["sample_fraction"] = *o.sampling.fraction;
  if (o.sampling.count) out["sample_count"] = *o.sampling.count;
  return out;
}

json StrategyCatalogJson() {
  json catalog = json::array();
  for (const strategy::StrategyKindSpelling& k : strategy::StrategyKinds()) {
    const json defaults = StrategyOptionsToJson(k.kind, strategy::DefaultStrategyOptions(k.kind));
    json options = json::array();
    for (std::string_view option : strategy::StrategyOptionNames(k.kind)) {
      const std::string key(option);
      const bool required = strategy::StrategyOptionRequired(k.kind, option);
      options.push_back({{"name", key}, {"default", required ? json() : defaults.at(key)}, {"required", required}});
    }
    catalog.push_back({{"name", std::string(k.name)}, {"options", std::move(options)}});
  }
  return catalog;
}

}  // namespace parsyn::coordinator
