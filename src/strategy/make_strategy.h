// MakeStrategy: the one place a job's strategy is built from its kind and options (job spec: distributed.strategy,
// distributed.strategy_options). Pure; safe from any thread.
#pragma once

#include <memory>

#include "base/status.h"
#include "strategy/fed_avg.h"
#include "strategy/strategy.h"
#include "strategy/strategy_options.h"

namespace parsyn::strategy {

// federated_averaging and fedprox: FedAvg (fedprox's mu reaches the workers through their tasks, options.mu; the
// aggregation is FedAvg's); fedavgm, fedadam, fedyogi, fedadagrad: ServerOptimizer. `options` as
// DefaultStrategyOptions(kind) and the job spec fill them; options.sampling applies to every kind (RoundContext).
// `fed_avg`: the accumulation of the FedAvg mean they are built on. FailedPrecondition "... is not available in this
// build" for a kind this build lacks (base has no Unimplemented code; the
// coordinator refuses such a job with 400 "not available in this build").
StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyKind kind, const StrategyOptions& options,
                                                 FedAvgOptions fed_avg = {});

}  // namespace parsyn::strategy
