#include "coordinator/sharding.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "data/dataset.h"

namespace parsyn::coordinator {

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

  // The same permutation this function drew with its own copy of SplitMix64 before the shuffle had one home in
  // src/data, so stored jobs split as before (the bounded draws differ only in which values they reject: a chance
  // under num_rows^2 / 2^64 per split).
  const std::vector<int64_t> order = data::ShuffledIndices(num_rows, strategy::SplitSeed(job_seed));

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
