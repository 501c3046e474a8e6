// MakeStrategy: the one place a job's strategy is built from its kind and options (job spec: distributed.strategy,
// distributed.strategy_options). Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "strategy/fed_avg.h"
#include "strategy/strategy.h"
#include "strategy/strategy_options.h"
#include "weights/keyed_stream.h"

namespace parsyn::strategy {

// federated_averaging and fedprox: FedAvg (fedprox's mu reaches the workers through their tasks, options.mu; the
// aggregation is FedAvg's); fedavgm, fedadam, fedyogi, fedadagrad: ServerOptimizer; median, trimmed_mean (beta), krum
// (f), multi_krum (f, m; unset: n - f): strategy/robust_aggregation.h; dp_fedavg (clip_norm, noise_multiplier,
// delta; its noise and sample drawn under `private_key`, the job's private seed): strategy/dp_fed_avg.h. `options` as
// DefaultStrategyOptions(kind) and the job spec fill them; options.sampling applies to every kind (each ConfigureRound
// is ChooseParticipants). InvalidArgument naming the option when it is out of range for the kind (each class's
// Validate). `fed_avg`: the accumulation of the FedAvg mean they are built on.
StatusOr<std::unique_ptr<Strategy>> MakeStrategy(StrategyKind kind, const StrategyOptions& options,
                                                 const weights::SecretKey& private_key, FedAvgOptions fed_avg = {});

}  // namespace parsyn::strategy
