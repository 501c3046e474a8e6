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

  // The same permutation, cut the same way, as this function drew with its own copy of SplitMix64 before the shuffle
  // had one home in src/data, so stored jobs split as before (the bounded draws differ only in which values they
  // reject: a chance under num_rows^2 / 2^64 per split).
  PARSYN_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> pieces,
                          data::ShuffledShards(num_rows, num_shards, strategy::SplitSeed(job_seed)));
  std::vector<Shard> shards(static_cast<size_t>(num_shards));
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::vector<int64_t>& piece = pieces[k];
    const int64_t size = static_cast<int64_t>(piece.size());
    // A piece is in the permutation's random order, so its first rows are a random validation sample of the shard.
    const int64_t num_validation =
        std::min(static_cast<int64_t>(std::llround(static_cast<double>(size) * validation_fraction)), size - 1);
    Shard& shard = shards[k];
    shard.validation_rows.assign(piece.begin(), piece.begin() + num_validation);
    shard.train_rows.assign(piece.begin() + num_validation, piece.end());
    // Ascending order: a worker reads its shard in one forward pass over the dataset file.
    std::sort(shard.validation_rows.begin(), shard.validation_rows.end());
    std::sort(shard.train_rows.begin(), shard.train_rows.end());
  }
  return shards;
}

}  // namespace parsyn::coordinator
