// Non-IID partitioners (distributed.partition, docs/training.md "Data partition"): label-skewed splits of a platform
// dataset into one shard per worker slot, and each shard's label histogram.
//
//   dirichlet          Hsu et al. 2019: for each class, proportions over the K workers ~ Dir(alpha, ..., alpha); the
//                      class's rows (in a seeded random order) are cut into K consecutive runs of those sizes.
//                      Rounding: largest remainder (each worker gets floor(n_c * p_k) rows, the rows left over go one
//                      each to the largest fractional parts, ties to the lower worker index), so a class's counts sum
//                      to n_c exactly. A draw that leaves a worker without rows is redrawn, with the next draw's
//                      generator, up to kMaxDirichletDraws times; after that the job fails with an error naming alpha.
//   shards_per_worker  McMahan et al. 2017: the rows sorted by label (a seeded random order within a class) cut into
//                      K * classes_per_worker nearly equal pieces (the first N % pieces get one extra row); piece s
//                      goes to worker perm[s % K] for a seeded permutation perm of the workers, so a worker's pieces
//                      lie K apart in label order. With classes whose row counts are multiples of the piece size and at
//                      most N / classes_per_worker, every worker holds exactly classes_per_worker classes.
//
// Of each shard, round(size * validation_fraction) rows of a seeded random order form its validation slice, always
// leaving one training row (as SplitRows does).
//
// Determinism: everything is drawn from PartitionRandom, SplitMix64 (data::SplitMix64) seeded from
// strategy::SplitSeed(job_seed) through a partition domain; the gamma draws are Marsaglia–Tsang over it with the
// normal variates of Marsaglia's polar method (only +, *, /, sqrt and log: no std:: distributions, whose output differs
// between standard libraries), so a job splits the same way on every machine.
// Pure functions and plain values; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "coordinator/job_spec.h"
#include "coordinator/sharding.h"
#include "data/dataset.h"

namespace parsyn::coordinator {

// How many Dirichlet draws a split tries before it fails because each left a worker without rows.
inline constexpr int kMaxDirichletDraws = 100;

// The partitioners' random source: uniform, normal, gamma and symmetric Dirichlet variates from SplitMix64.
class PartitionRandom {
 public:
  explicit PartitionRandom(uint64_t seed) : bits_(seed) {}

  // Uniform in [0, bound); bound > 0.
  uint64_t Below(uint64_t bound) { return bits_.Below(bound); }
  // Uniform in (0, 1), 53-bit resolution.
  double Uniform();
  // Standard normal (Marsaglia's polar method; the second variate of each pair is dropped).
  double Normal();
  // The natural log of a Gamma(shape, 1) variate, shape > 0 (Marsaglia–Tsang 2000; for shape < 1 the boost
  // Gamma(shape) = Gamma(shape + 1) * U^(1/shape), kept in logs so that tiny shapes do not underflow to 0).
  double LogGamma(double shape);
  // A symmetric Dirichlet(alpha, ..., alpha) draw of `k` proportions (non-negative, summing to 1 up to rounding).
  std::vector<double> Dirichlet(int k, double alpha);
  // Fisher–Yates, in place.
  void Shuffle(std::vector<int64_t>& items);

 private:
  data::SplitMix64 bits_;
};

// The generator of Dirichlet draw `draw` (0-based) of a job's split, and of the shards_per_worker split (draw 0).
uint64_t PartitionSeed(uint64_t job_seed, int draw);

// Splits the rows (their labels read by data::ReadRowLabels) by `partition` into `num_shards` shards (see above). For
// method iid this is SplitRows over labels.size() rows. InvalidArgument: fewer rows than shards (or than num_shards *
// classes_per_worker pieces), classes_per_worker above the number of classes, or every Dirichlet draw leaving a worker
// empty; each message names the distributed.partition field to change.
StatusOr<std::vector<Shard>> SplitRowsByLabel(const data::RowLabels& rows, int num_shards, double validation_fraction,
                                              const DataPartition& partition, uint64_t job_seed);

// Training rows per class of each shard: histograms[shard][class].
std::vector<std::vector<int64_t>> LabelHistograms(const std::vector<Shard>& shards, const data::RowLabels& rows);

// {"<class name>": count, ...} of the classes with a count above 0.
std::string LabelHistogramJson(std::span<const int64_t> counts, const std::vector<std::string>& class_names);

}  // namespace parsyn::coordinator
