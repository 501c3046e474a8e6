#include "strategy/strategy_options.h"

namespace parsyn::strategy {
namespace {

constexpr StrategyKindSpelling kKinds[] = {
    {"federated_averaging", StrategyKind::kFederatedAveraging},
    {"fedprox", StrategyKind::kFedProx},
    {"fedavgm", StrategyKind::kFedAvgM},
    {"fedadam", StrategyKind::kFedAdam},
    {"fedyogi", StrategyKind::kFedYogi},
    {"fedadagrad", StrategyKind::kFedAdagrad},
    {"median", StrategyKind::kMedian},
    {"trimmed_mean", StrategyKind::kTrimmedMean},
    {"krum", StrategyKind::kKrum},
    {"multi_krum", StrategyKind::kMultiKrum},
    {"dp_fedavg", StrategyKind::kDpFedAvg},
};

constexpr std::string_view kFedProxOptions[] = {"mu"};
constexpr std::string_view kFedAvgMOptions[] = {"server_learning_rate", "server_momentum"};
constexpr std::string_view kAdaptiveOptions[] = {"server_learning_rate", "beta1", "beta2", "tau"};
constexpr std::string_view kAdagradOptions[] = {"server_learning_rate", "beta1", "tau"};
constexpr std::string_view kTrimmedMeanOptions[] = {"beta"};
constexpr std::string_view kKrumOptions[] = {"f"};
constexpr std::string_view kMultiKrumOptions[] = {"f", "m"};
constexpr std::string_view kDpOptions[] = {"clip_norm", "noise_multiplier", "delta"};

}  // namespace

std::span<const StrategyKindSpelling> StrategyKinds() { return kKinds; }

std::string_view StrategyKindName(StrategyKind kind) {
  for (const StrategyKindSpelling& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

std::span<const std::string_view> StrategyOptionNames(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kFederatedAveraging: return {};
    case StrategyKind::kFedProx: return kFedProxOptions;
    case StrategyKind::kFedAvgM: return kFedAvgMOptions;
    case StrategyKind::kFedAdam: return kAdaptiveOptions;
    case StrategyKind::kFedYogi: return kAdaptiveOptions;
    case StrategyKind::kFedAdagrad: return kAdagradOptions;
    case StrategyKind::kMedian: return {};
    case StrategyKind::kTrimmedMean: return kTrimmedMeanOptions;
    case StrategyKind::kKrum: return kKrumOptions;
    case StrategyKind::kMultiKrum: return kMultiKrumOptions;
    case StrategyKind::kDpFedAvg: return kDpOptions;
  }
  return {};
}

StrategyOptions DefaultStrategyOptions(StrategyKind kind) {
  StrategyOptions o;
  switch (kind) {
    case StrategyKind::kFederatedAveraging: break;
    case StrategyKind::kFedProx: o.mu = 0.01; break;
    // Hsu et al. 2019 use server momentum 0.9 with server learning rate 1.
    case StrategyKind::kFedAvgM:
      o.server_learning_rate = 1.0;
      o.server_momentum = 0.9;
      break;
    // Reddi et al. 2021's (and Flower's) defaults.
    case StrategyKind::kFedAdam:
      o.server_learning_rate = 0.1;
      o.beta1 = 0.9;
      o.beta2 = 0.99;
      o.tau = 1e-9;
      break;
    case StrategyKind::kFedYogi:
      o.server_learning_rate = 0.01;
      o.beta1 = 0.9;
      o.beta2 = 0.99;
      o.tau = 1e-3;
      break;
    case StrategyKind::kFedAdagrad:
      o.server_learning_rate = 0.1;
      o.beta1 = 0.0;
      o.tau = 1e-9;
      break;
    case StrategyKind::kMedian: break;
    case StrategyKind::kTrimmedMean: o.beta = 0.1; break;
    case StrategyKind::kKrum: o.f = 0; break;
    case StrategyKind::kMultiKrum: o.f = 0; break;
    case StrategyKind::kDpFedAvg:
      o.noise_multiplier = 1.0;
      o.delta = 1e-5;
      break;
  }
  return o;
}

bool StrategyOptionRequired(StrategyKind kind, std::string_view option) {
  return kind == StrategyKind::kDpFedAvg && option == "clip_norm";
}

}  // namespace parsyn::strategy
