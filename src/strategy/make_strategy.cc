#include "strategy/make_strategy.h"

#include <string>

#include "strategy/dp_fed_avg.h"
#include "strategy/robust_aggregation.h"
#include "strategy/server_optimizer.h"

namespace parsyn::strategy {

StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyKind kind, const StrategyOptions& options,
                                                 const weights::SecretKey& private_key, FedAvgOptions fed_avg) {
  switch (kind) {
    case StrategyKind::kFederatedAveraging:
    case StrategyKind::kFedProx: return std::unique_ptr<Strategy>(std::make_unique<FedAvg>(fed_avg));
    case StrategyKind::kFedAvgM:
    case StrategyKind::kFedAdam:
    case StrategyKind::kFedYogi:
    case StrategyKind::kFedAdagrad:
      return std::unique_ptr<Strategy>(std::make_unique<ServerOptimizer>(kind, options, fed_avg));
    case StrategyKind::kMedian: return std::unique_ptr<Strategy>(std::make_unique<Median>());
    case StrategyKind::kTrimmedMean: {
      const TrimmedMeanOptions o{.beta = options.beta};
      PARSYN_RETURN_IF_ERROR(TrimmedMean::Validate(o));
      return std::unique_ptr<Strategy>(std::make_unique<TrimmedMean>(o));
    }
    case StrategyKind::kKrum: {
      const KrumOptions o{.f = options.f};
      PARSYN_RETURN_IF_ERROR(Krum::Validate(o));
      return std::unique_ptr<Strategy>(std::make_unique<Krum>(o));
    }
    case StrategyKind::kMultiKrum: {
      const MultiKrumOptions o{.f = options.f, .m = options.m.value_or(0)};
      PARSYN_RETURN_IF_ERROR(MultiKrum::Validate(o));
      return std::unique_ptr<Strategy>(std::make_unique<MultiKrum>(o));
    }
    case StrategyKind::kDpFedAvg: {
      const DpFedAvgOptions o{.clip_norm = options.clip_norm,
                              .noise_multiplier = options.noise_multiplier,
                              .delta = options.delta,
                              .noise_from_workers = options.noise_from_workers};
      PARSYN_RETURN_IF_ERROR(ValidateDpFedAvgOptions(o));
      return std::unique_ptr<Strategy>(std::make_unique<DpFedAvg>(o, private_key));
    }
  }
  return InvalidArgumentError("unknown strategy kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace parsyn::strategy
