// ServerOptimizer: FedAvgM (Hsu et al. 2019) and FedAdam, FedYogi, FedAdagrad (Reddi et al. 2021, "Adaptive
// Federated Optimization", Algorithm 2). The round's FedAvg mean (FedAvg's plan, streamed by RoundAggregation) gives
// the pseudo-gradient, and a server optimizer steps the global along it (its finish step):
//   delta = mean - global
//   fedavgm:     v = momentum * v + delta;                      w = global + lr * v
//   fedadam:     m = b1 * m + (1 - b1) * delta;  v = b2 * v + (1 - b2) * delta^2
//   fedyogi:     m as fedadam;                   v = v - (1 - b2) * delta^2 * sign(v - delta^2)
//   fedadagrad:  m as fedadam;                   v = v + delta^2
//   adaptive:    w = global + lr * m / (sqrt(v) + tau)
// m and v start at zero; no bias correction (as the paper and Flower). All arithmetic is fp32, element by element,
// in the order written (the NumPy reference, tests/reference/server_optimizers.py, computes the same); the new
// global is rounded to the global's dtype. Memory: the FedAvg sums, a copy of the round's global, and one (fedavgm)
// or two fp32 tensors per parameter: O(model), whatever the number of workers.
//
// State: the moments, as a WeightSet of fp32 tensors "m/<name>", "v/<name>" (fedavgm: "v/<name>" only). Finish
// computes the next state as pending; it becomes the state the next round starts from only on CommitState (the round
// was committed), so a failed or retried round starts again from the same state. The job runner stores the pending
// state beside the round's global and restores it when a job resumes (RestoreState), so a restarted coordinator
// continues bit-identically. Threads: see Strategy.
#pragma once

#include <optional>
#include <string_view>

#include "strategy/fed_avg.h"
#include "strategy/strategy_options.h"

namespace parsyn::strategy {

class ServerOptimizer : public Strategy {
 public:
  // kind: kFedAvgM, kFedAdam, kFedYogi or kFedAdagrad; options as DefaultStrategyOptions(kind) fills them.
  ServerOptimizer(StrategyKind kind, const StrategyOptions& options, FedAvgOptions fed_avg = {});

  std::string_view name() const override { return StrategyKindName(kind_); }
  std::vector<ParticipantConfig> ConfigureRound(const RoundContext& ctx,
                                                std::span<const Candidate> available) const override;
  // FedAvg's plan (the sample-weighted mean; InvalidArgument on a non-float tensor); also InvalidArgument when a
  // restored state does not fit the global's layout. Keeps a copy of `global`.
  StatusOr<RoundPlan> BeginRound(int round, const weights::WeightSet& global) override;
  // The optimizer's step from `mean`, whose bytes become the new global's; the next state becomes pending.
  StatusOr<weights::WeightSet> FinishFromMean(weights::WeightSet mean, int count) override;

  bool has_state() const override { return true; }
  const weights::WeightSet* PendingState() const override { return pending_ ? &*pending_ : nullptr; }
  void CommitState() override;
  Status RestoreState(const weights::WeightSet* state) override;

 private:
  bool adaptive() const { return kind_ != StrategyKind::kFedAvgM; }

  StrategyKind kind_;
  StrategyOptions options_;
  FedAvg fed_avg_;                             // the plan of the round's mean
  std::optional<weights::WeightSet> global_;   // the round's starting global, copied at Begin
  std::optional<weights::WeightSet> state_;    // committed; empty: zeros (no round committed yet)
  std::optional<weights::WeightSet> pending_;  // from the last Finish, until CommitState or the next Begin
};

}  // namespace parsyn::strategy
