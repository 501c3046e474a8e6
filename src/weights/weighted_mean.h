// Streaming weighted mean (FedAvg's aggregation): result = sum(n_i * w_i) / sum(n_i).
//
// Built from the global's layout; updates are accepted one at a time as they arrive, so memory is O(parameters)
// whatever the number of updates. Not thread-safe: one owner calls Accept/Finish (internally the work is spread over
// a few threads by chunk).
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

enum class Accumulation {
  // fp32 running sum: fastest; the result depends (in the last bits) on the order updates arrive in.
  kFloat32,
  // fp64 running sum: more precise; still order-dependent in the last bits.
  kFloat64,
  // Exact fixed-point sum (each n_i * w_i rounded once to a fixed grid, then summed as integers): the result is
  // bit-identical whatever the arrival order. Use where reproducibility is asked for.
  kExact,
};

struct WeightedMeanOptions {
  Accumulation accumulation = Accumulation::kFloat32;
  int num_threads = 0;  // 0: a sensible default for this machine
};

class WeightedMean {
 public:
  // `layout` gives the names, dtypes and shapes every update must have; its float tensors (F32, BF16, F16) are
  // averaged. Only its layout is read; it need not outlive the constructor.
  explicit WeightedMean(const WeightSet& layout, WeightedMeanOptions options = {});
  ~WeightedMean();
  WeightedMean(WeightedMean&&) noexcept;
  WeightedMean& operator=(WeightedMean&&) noexcept;

  // Adds `n * update`. InvalidArgument (and nothing is added) if the layout differs in any name, dtype or shape, a
  // value is not finite, a tensor is not a float dtype, or n is not finite and > 0.
  Status Accept(const WeightSet& update, double n);

  int num_accepted() const;
  double total_weight() const;

  // The mean in the layout's dtypes (rounded to nearest even for BF16/F16). FailedPrecondition if nothing was
  // accepted.
  StatusOr<WeightSet> Finish() &&;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parsyn::weights
