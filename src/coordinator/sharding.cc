#include "coordinator/sharding.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace parsyn::coordinator {
namespace {

// SplitMix64 as a generator: small, fast, and fully specified, so the split is the same on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    const uint64_t out = strategy::Mix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }
  // Uniform in [0, bound), bound >= 1, without modulo bias (rejection of the incomplete top range).
  uint64_t Below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace

StatusOr<std::vector<Shard>> SplitRows(int64_t num_rows, int num_shards, double validation_fraction,
                                       uint64_t job_seed) {
  if (num_shards < 1) return InvalidArgumentError("number of shards must be >= 1, got " + std::to_string(num_shards));
  if (num_rows < num_shards) {
    return InvalidArgumentError("the dataset has " + std::to_string(num_rows) + " rows, fewer than the " +
                                std::to_string(num_shards) + " shards it must be split into");
  }
  if (!(validation_fraction >= 0.0 && validation_fraction <= 0.5)) {
    return InvalidArgumentError("validation fraction must be in [0, 0.5], got " + std::to_string(validation_fraction));
  }

  std::vector<int64_t> order(static_cast<size_t>(num_rows));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Fisher-Yates, from the end.
  SplitMix64 rng(strategy::SplitSeed(job_seed));
  for (size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[rng.Below(i + 1)]);
  }

  std::vector<Shard> shards(static_cast<size_t>(num_shards));
  const int64_t base = num_rows / num_shards;
  const int64_t extra = num_rows % num_shards;
  auto next = order.begin();
  for (int k = 0; k < num_shards; ++k) {
    const int64_t size = base + (k < extra ? 1 : 0);
    // The permutation is random, so its first rows in each piece are a random validation sample of the shard.
    const int64_t num_validation =
        std::min(static_cast<int64_t>(std::llround(static_cast<double>(size) * validation_fraction)), size - 1);
    Shard& shard = shards[static_cast<size_t>(k)];
    shard.validation_rows.assign(next, next + num_validation);
    shard.train_rows.assign(next + num_validation, next + size);
    next += size;
    // Ascending order: a worker reads its shard in one forward pass over the dataset file.
    std::sort(shard.validation_rows.begin(), shard.validation_rows.end());
    std::sort(shard.train_rows.begin(), shard.train_rows.end());
  }
  return shards;
}

}  // namespace parsyn::coordinator
