#include "coordinator/sharding.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "data/dataset.h"

namespace parsyn::coordinator {

int64_t ValidationRowsOf(int64_t size, double validation_fraction) {
  return std::min(static_cast<int64_t>(std::llround(static_cast<double>(size) * validation_fraction)), size - 1);
}

std::vector<int64_t> ShardTrainRowCounts(int64_t num_rows, int num_shards, double validation_fraction) {
  if (!CheckSplit(num_rows, num_shards, validation_fraction).ok()) return {};
  std::vector<int64_t> counts;
  for (int k = 0; k < num_shards; ++k) {
    // data::ShuffledShards' cut: the first num_rows % num_shards pieces get the extra row.
    const int64_t size = num_rows / num_shards + (k < num_rows % num_shards ? 1 : 0);
    counts.push_back(size - ValidationRowsOf(size, validation_fraction));
  }
  return counts;
}

std::optional<std::string> UnevenShardsWarning(const std::vector<int64_t>& shard_train_rows) {
  if (shard_train_rows.size() < 2) return std::nullopt;
  const auto [smallest, largest] = std::minmax_element(shard_train_rows.begin(), shard_train_rows.end());
  if (*largest <= 4 * *smallest) return std::nullopt;
  return "the job's shards differ more than 4x in training rows (smallest " + std::to_string(*smallest) + ", largest " +
         std::to_string(*largest) +
         "): every worker runs the same steps per round, so those on small shards repeat their rows many times";
}

Status CheckSplit(int64_t num_rows, int num_shards, double validation_fraction) {
  if (num_shards < 1) return InvalidArgumentError("number of shards must be >= 1, got " + std::to_string(num_shards));
  if (num_rows < num_shards) {
    return InvalidArgumentError("the dataset has " + std::to_string(num_rows) + " rows, fewer than the " +
                                std::to_string(num_shards) + " shards it must be split into");
  }
  if (!(validation_fraction >= 0.0 && validation_fraction <= 0.5)) {
    return InvalidArgumentError("validation fraction must be in [0, 0.5], got " + std::to_string(validation_fraction));
  }
  return Status::Ok();
}

StatusOr<std::vector<Shard>> SplitRows(int64_t num_rows, int num_shards, double validation_fraction,
                                       uint64_t job_seed) {
  PARSYN_RETURN_IF_ERROR(CheckSplit(num_rows, num_shards, validation_fraction));

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
    const int64_t num_validation = ValidationRowsOf(size, validation_fraction);
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
