#include "strategy/make_strategy.h"

#include <string>

#include "strategy/server_optimizer.h"

namespace parsyn::strategy {
namespace {

Status NotInThisBuild(StrategyKind kind) {
  return FailedPreconditionError("strategy " + std::string(StrategyKindName(kind)) + " is not available in this build");
}

}  // namespace

StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyKind kind, const StrategyOptions& options,
                                                 FedAvgOptions fed_avg) {
  switch (kind) {
    case StrategyKind::kFederatedAveraging:
    case StrategyKind::kFedProx: return std::unique_ptr<Strategy>(std::make_unique<FedAvg>(fed_avg));
    case StrategyKind::kFedAvgM:
    case StrategyKind::kFedAdam:
    case StrategyKind::kFedYogi:
    case StrategyKind::kFedAdagrad:
      return std::unique_ptr<Strategy>(std::make_unique<ServerOptimizer>(kind, options, fed_avg));
    // INTEGRATION: the robust aggregation classes (strategy/robust_*.h) replace these four cases.
    case StrategyKind::kMedian: return NotInThisBuild(kind);
    case StrategyKind::kTrimmedMean: return NotInThisBuild(kind);
    case StrategyKind::kKrum: return NotInThisBuild(kind);
    case StrategyKind::kMultiKrum: return NotInThisBuild(kind);
    // INTEGRATION: dp_fedavg (strategy/dp_*.h) replaces this case.
    case StrategyKind::kDpFedAvg: return NotInThisBuild(kind);
  }
  return NotInThisBuild(kind);
}

}  // namespace parsyn::strategy
