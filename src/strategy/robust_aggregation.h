// Robust (Byzantine-resilient) aggregation: coordinate-wise median, coordinate-wise trimmed mean, Krum and
// Multi-Krum. Each replaces FedAvg's weighted mean by a rule that a minority of arbitrary (faulty or malicious)
// updates cannot drag far from what the honest majority sent.
//
// Shared rules (RobustAggregation):
// - Participants: exactly FedAvg's ConfigureRound (the same call, not a copy).
// - Validation as every strategy's (RoundAggregation): the layout equals the global's, values finite, sample_count > 0.
// - Sample counts are validated but not used: a Byzantine worker can claim any count, so every accepted update
//   weighs the same (as in the papers; Flower weights Multi-Krum's final average by sample count, we do not).
// - The result has the global's dtypes: computed in float/double, rounded to nearest even for BF16/F16.
// - Deterministic whatever the arrival order: median and trimmed mean sort the values of each coordinate; Krum
//   orders the updates canonically first (by their bytes, tensor by tensor, then by sample count), so distances,
//   ties and the final sum never depend on arrival.
// - Memory: these rules need every update at Finish, so their plan keeps the updates as given (Combination::kKeepAll,
//   in RoundAggregation): AcceptOwned keeps the update without copying (the coordinator hands memory-mapped files: the
//   page cache holds them, not the heap); Accept copies it (K x model bytes). Finish walks the model tensor by tensor
//   and each tensor in chunks of kChunkElements, so its extra memory is O(K x chunk) (K x 64 KiB of fp32 staging, plus
//   a K x K double matrix for Krum) besides the output (one model in the global's dtypes), never O(K x model).
//
// Threads: see Strategy. Finish runs on the caller's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strategy/strategy.h"

namespace parsyn::strategy {

class RobustAggregation : public Strategy {
 public:
  // Elements of one tensor processed at a time by Finish.
  static constexpr size_t kChunkElements = size_t{1} << 14;

  // FedAvg's selection: all available when they fit in max_workers, else a window rotating by round.
  std::vector<ParticipantConfig> ConfigureRound(const RoundContext& ctx,
                                                std::span<const Candidate> available) const override;

  // Every update kept. InvalidArgument if the options are out of range (see the subclass' Validate) or a global
  // tensor is not F32, BF16 or F16.
  StatusOr<RoundPlan> BeginRound(int round, const weights::WeightSet& global) override;
  // The rule over `updates` (reordered canonically, see above). FailedPrecondition if the rule needs more updates
  // than came (Krum: n >= 2f + 3).
  StatusOr<weights::WeightSet> FinishFromKept(std::vector<KeptUpdate>& updates,
                                              const std::vector<LayoutEntry>& layout) override;

 protected:
  // Options out of range -> InvalidArgument naming the option.
  virtual Status ValidateOptions() const = 0;
  // Whether `count` updates are enough; FailedPrecondition saying why not.
  virtual Status CheckUpdateCount(int count) const { return Status::Ok(); }
  // The new global from `updates` (at least one, in canonical order, see above) with layout `layout`.
  virtual StatusOr<weights::WeightSet> Aggregate(const std::vector<KeptUpdate>& updates,
                                                 const std::vector<LayoutEntry>& layout) = 0;
};

// Coordinate-wise median (Yin et al. 2018): result[j] = median_i(w_i[j]). For an even count, the mean of the two
// middle values, computed in double and rounded once to float: float((double(a) + double(b)) / 2). For an odd count
// it is one of the values, unchanged. No options.
class Median : public RobustAggregation {
 public:
  std::string_view name() const override { return "median"; }

 protected:
  Status ValidateOptions() const override { return Status::Ok(); }
  StatusOr<weights::WeightSet> Aggregate(const std::vector<KeptUpdate>& updates,
                                         const std::vector<LayoutEntry>& layout) override;
};

struct TrimmedMeanOptions {
  // Fraction trimmed from EACH end of every coordinate: with n updates, k = floor(beta * n) smallest and k largest
  // values are dropped and the n - 2k left are averaged. 0 <= beta < 0.5 (so at least one value is left).
  double beta = 0.2;
};

// Coordinate-wise trimmed mean (Yin et al. 2018): result[j] = mean of w_(k+1)[j] .. w_(n-k)[j], the values of
// coordinate j sorted ascending; summed in double in that order, divided by n - 2k, rounded once to float.
class TrimmedMean : public RobustAggregation {
 public:
  explicit TrimmedMean(TrimmedMeanOptions options = {});
  // InvalidArgument naming `beta` when out of [0, 0.5).
  static Status Validate(const TrimmedMeanOptions& options);

  std::string_view name() const override { return "trimmed_mean"; }
  const TrimmedMeanOptions& options() const { return options_; }

 protected:
  Status ValidateOptions() const override { return Validate(options_); }
  StatusOr<weights::WeightSet> Aggregate(const std::vector<KeptUpdate>& updates,
                                         const std::vector<LayoutEntry>& layout) override;

 private:
  TrimmedMeanOptions options_;
};

// Krum and Multi-Krum (Blanchard et al. 2017). With n updates and f assumed Byzantine, the score of update i is
// the sum of its squared Euclidean distances (over all tensors, in double) to its n - f - 2 nearest other updates;
// Krum returns the update with the lowest score, unchanged; Multi-Krum the plain mean of the m lowest-scoring
// updates (summed in double, canonical order, rounded once to float). Equal scores: the update first in canonical
// order wins. Needs n >= 2f + 3 updates at Finish (the paper's condition), else FailedPrecondition.
struct KrumOptions {
  int f = 0;  // assumed number of Byzantine updates, >= 0
};

struct MultiKrumOptions {
  int f = 0;  // assumed number of Byzantine updates, >= 0
  int m = 0;  // updates averaged, >= 1; 0 (the default): n - f of the round's n updates. m > n fails at Finish.
};

class KrumBase : public RobustAggregation {
 protected:
  KrumBase(int f, int m) : f_(f), m_(m) {}
  Status CheckUpdateCount(int count) const override;
  StatusOr<weights::WeightSet> Aggregate(const std::vector<KeptUpdate>& updates,
                                         const std::vector<LayoutEntry>& layout) override;

  int f_;
  int m_;  // 0: n - f
};

class Krum : public KrumBase {
 public:
  explicit Krum(KrumOptions options = {});
  // InvalidArgument naming `f` when negative.
  static Status Validate(const KrumOptions& options);

  std::string_view name() const override { return "krum"; }

 protected:
  Status ValidateOptions() const override { return Validate(KrumOptions{.f = f_}); }
};

class MultiKrum : public KrumBase {
 public:
  explicit MultiKrum(MultiKrumOptions options = {});
  // InvalidArgument naming `f` when negative, `m` when negative.
  static Status Validate(const MultiKrumOptions& options);

  std::string_view name() const override { return "multi_krum"; }

 protected:
  Status ValidateOptions() const override { return Validate(MultiKrumOptions{.f = f_, .m = m_}); }
};

}  // namespace parsyn::strategy
