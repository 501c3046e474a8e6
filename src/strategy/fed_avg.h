// FedAvg (McMahan et al. 2017): the new global is the sample-weighted mean of the round's updates,
//   global = sum(n_i * w_i) / sum(n_i),  n_i = the worker's sample count (training examples), not the steps it ran.
// Its plan: a weighted mean (Combination::kWeightedMean) weighted by sample count, and the mean is the new global.
// RoundAggregation sums it in a weights::WeightedMean: as updates arrive for models whose exact sums fit its budget,
// else chunk by chunk over the updates waiting in their files when the round aggregates; memory is O(parameters)
// whatever the number of workers (docs/training.md, "Coordinator memory per parameter").
// Threads: see Strategy.
#pragma once

#include "strategy/strategy.h"
#include "weights/weighted_mean.h"

namespace parsyn::strategy {

struct FedAvgOptions {
  // kExact by default: the mean is bit-identical whatever order the updates arrive in, which the job's
  // reproducibility (same job twice, or interrupted and resumed -> same global weights) depends on. The float
  // accumulations are faster but their last bits follow the arrival order.
  weights::Accumulation accumulation = weights::Accumulation::kExact;
  int num_threads = 0;  // passed to WeightedMean; 0: its default
};

class FedAvg : public Strategy {
 public:
  explicit FedAvg(FedAvgOptions options = {});

  std::string_view name() const override { return "federated_averaging"; }

  // ChooseParticipants (strategy/sampling.h): all available workers when they fit in max_workers, otherwise a window
  // that rotates by round; or the job's client sampling.
  std::vector<ParticipantConfig> ConfigureRound(const RoundContext& ctx,
                                                std::span<const Candidate> available) const override;

  // The sample-weighted mean of the updates as given, with `options`' accumulation. InvalidArgument if a tensor of
  // `global` is not a float (F32, F16, BF16, F64).
  StatusOr<RoundPlan> BeginRound(int round, const weights::WeightSet& global) override;

 private:
  FedAvgOptions options_;
};

}  // namespace parsyn::strategy
