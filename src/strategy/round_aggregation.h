// RoundAggregation: the kernel of a round's aggregation, the one place that holds a round's updates. It follows its
// Strategy's policy (strategy.h): the strategy plans the round at Begin (RoundPlan), and RoundAggregation validates
// each update, then sums it into a weights::WeightedMean (weighted by its sample count or 1, transformed first where
// the plan says so) or keeps it whole (Combination::kKeepAll), and at Finish hands the mean or the kept updates to the
// strategy's finish step, which gives the new global.
//
// Validation (the same for every strategy): Begin before Accept; sample_count > 0; the update's layout equals the
// global's (names, dtypes, shapes) and every value is finite. A rejected update does not count.
//
// LoRA adapters of mixed ranks (LoraRanks other than kSame): an update may have any LoRA rank up to the global's
// (weights::CheckLoraLayoutUpToRank), trained at PEFT's scaling alpha / r of its rank: its products are first scaled by
// r_max / r into the global's units (weights::ScaleLoraProducts). kZeroPadded: a lower-rank update is then padded with
// zeros to the global's rank (weights::ZeroPadLoraRank) and then combines as the strategy plans, like any other.
// kFactored: a lower-rank update (trained from the global's truncated SVD) is completed with the global's own ranks
// beyond its rank, taken from the global's SVD form (weights::ExtendLoraRank: what the worker did not train stays as
// the global has it, where zeros would shrink it), updates are kept, and Finish hands the strategy their exact weighted
// mean in factored form (weights::FactoredLoraMean: the mean of the products B·A, truncated to the global's rank) as
// the mean it finishes from; only a strategy that plans a plain weighted mean can aggregate so.
//
// Memory: a plain weighted mean streams updates into its sums (AcceptOwned keeps owned updates and adds them in
// batches, weights/weighted_mean.h), and the sums are reused from round to round; kept updates are held as given
// (AcceptOwned: no copy; the coordinator's are read-only mappings) and released when Finish succeeds.
//
// Threads: one owner calls it, from one thread at a time (the coordinator's event loop, or a pool thread while the
// job's mutex is held); not thread-safe. Its weighted mean spreads its work over threads of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"
#include "strategy/strategy.h"
#include "weights/weight_set.h"
#include "weights/weighted_mean.h"

namespace parsyn::strategy {

// LoRA updates whose rank differs from the global's: refused (kSame), padded (kZeroPadded) or averaged exactly in
// factored form (kFactored); see above.
enum class LoraRanks { kSame, kZeroPadded, kFactored };

class RoundAggregation {
 public:
  // Aggregates with `strategy`'s policy; `strategy` must outlive this. `lora_ranks`: how LoRA updates of ranks other
  // than the global's combine (see above).
  explicit RoundAggregation(Strategy& strategy, LoraRanks lora_ranks = LoraRanks::kSame);

  Strategy& strategy() const { return strategy_; }

  // Starts aggregating `round` on top of `global` (the latest committed global: its names, dtypes and shapes are what
  // every update must have), as Strategy::BeginRound plans it. Discards any aggregation in progress (a failed round
  // that is retried). The strategy's error (InvalidArgument: e.g. a non-float tensor) leaves everything as it was.
  Status Begin(int round, const weights::WeightSet& global);

  // Adds one worker's update (borrowed: a kept one is copied), with `sample_count` the training examples behind it.
  // InvalidArgument, and the update does not count, if sample_count is not positive, its layout differs from the
  // global's, a value is not finite, or the strategy's transform refuses it. FailedPrecondition if Begin was not
  // called. `weight_scale` (> 0) multiplies the update's weight (an asynchronous job's staleness weight,
  // buffered_aggregation.h).
  Status Accept(const weights::WeightSet& update, int64_t sample_count, double weight_scale = 1.0);

  // As Accept, same verdict, now, but takes the update over: a weighted mean may keep it and add several together
  // later (before Finish returns), a kept update is kept without a copy. `max_magnitude`: the update's largest |value|
  // when a check that read every value (and found them finite) already knows it, so the mean need not read the values
  // for it (else nullopt).
  Status AcceptOwned(weights::WeightSet update, int64_t sample_count, std::optional<double> max_magnitude,
                     double weight_scale = 1.0);

  // True when AcceptOwned(update, ..., max_magnitude) with a known max_magnitude would return in microseconds (it
  // judges and keeps the update, with no pass over its values and no wait for kept updates being added): cheap enough
  // for a caller that must not block long (the coordinator's event loop). Only a plain weighted mean can.
  bool AcceptOwnedIsQuick(const weights::WeightSet& update) const;

  // Adds the updates AcceptOwned kept for the mean, now (the caller is idle and expects no other update soon); a
  // no-op when none are kept.
  void AddKeptUpdates();

  // Whether the round's plan transforms updates (RoundPlan::transformed_layout): its finish step takes their mean in
  // that layout (dp_fedavg: float32 deltas), not a mean of weights.
  bool finishes_from_transformed() const { return transforms_updates_; }

  // Updates that counted since Begin; 0 after Finish.
  int num_accepted() const;

  // The new global from the updates accepted since Begin (the strategy's finish step); afterwards Begin must be
  // called again. FailedPrecondition if Begin was not called or nothing was accepted; the strategy's errors as it
  // gives them (kept updates: with the round as context, and they stay kept until the next Begin).
  StatusOr<weights::WeightSet> Finish();

 private:
  // The checks every update passes before it counts (see above).
  Status Validate(const weights::WeightSet& update, int64_t sample_count, double weight_scale) const;
  double WeightOf(int64_t sample_count, double weight_scale) const;
  // Adds `update` through the strategy's TransformUpdate (RoundPlan::transformed_layout).
  Status AddTransformed(const weights::WeightSet& update, double weight);
  std::string UpdateContext() const;
  // lora_ranks_ other than kSame: `update` at the global's rank when its own is lower (checked against it): padded
  // with zeros (kZeroPadded), or completed with the global's own ranks beyond it (kFactored: ExtendLoraRank).
  StatusOr<weights::WeightSet> ToGlobalRank(weights::WeightSet update) const;
  // Finish for factored_: the kept updates' factored mean, handed to the strategy's FinishFromMean.
  StatusOr<weights::WeightSet> FinishFactored(int count);

  Strategy& strategy_;
  int round_ = 0;
  bool begun_ = false;  // between Begin and a successful Finish
  Combination combination_ = Combination::kWeightedMean;
  bool weighted_by_sample_count_ = false;
  bool transforms_updates_ = false;
  const LoraRanks lora_ranks_;
  bool factored_ = false;  // lora_ranks_ kFactored: updates kept and averaged in factored form
  // lora_ranks_ other than kSame: the round's global (small: adapters), in its SVD form for kFactored.
  weights::WeightSet lora_base_;
  int64_t lora_base_rank_ = 0;
  std::vector<LayoutEntry> layout_;            // the round's global
  std::optional<weights::WeightedMean> mean_;  // kWeightedMean: the round's sums; kept after Finish for reuse
  std::vector<KeptUpdate> kept_;               // kKeepAll and factored_: in arrival order
};

}  // namespace parsyn::strategy
