// Sharding: the job's seeded, roughly equal, random split of a dataset's rows into one shard per worker slot, each
// with a validation slice held out for per-round evaluation (docs/architecture.md §5).
//
// Determinism: the split depends only on (num_rows, num_shards, validation_fraction, job seed) through
// strategy::SplitSeed and data::ShuffledIndices (the project's one seeded shuffle, platform-independent by
// construction), so the same job always splits the same way on any machine. A worker's training seed per round is
// TaskSeed below.
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "strategy/seed.h"

namespace parsyn::coordinator {

// The seed of the worker that trains shard `shard` (0-based) in round `round` (1-based) of a job seeded with
// `job_seed`: strategy::TaskSeed, Mix64(Mix64(Mix64(job_seed ^ domain) + round) + shard). The same for every attempt
// of a round, so a retried round trains as the failed attempt would have.
using strategy::TaskSeed;

struct Shard {
  std::vector<int64_t> train_rows;       // ascending row indices (0-based, in the dataset's order)
  std::vector<int64_t> validation_rows;  // ascending; disjoint from train_rows

  int64_t num_rows() const { return static_cast<int64_t>(train_rows.size() + validation_rows.size()); }
};

// Splits rows 0..num_rows-1 into `num_shards` shards: a seeded random permutation cut into consecutive pieces whose
// sizes differ by at most one (the first num_rows % num_shards shards get the extra row). Of each shard,
// round(size * validation_fraction) randomly chosen rows form its validation slice, but always leaving at least one
// training row. Every row is in exactly one shard and one of its two lists.
// InvalidArgument if num_shards < 1, num_rows < num_shards (a shard would be empty), or validation_fraction is not
// in [0, 0.5].
StatusOr<std::vector<Shard>> SplitRows(int64_t num_rows, int num_shards, double validation_fraction, uint64_t job_seed);

// Whether `num_rows` rows can be split into `num_shards` shards holding out `validation_fraction`, as SplitRows and
// the partitions (partition.h) require: InvalidArgument, saying which, as SplitRows documents; Ok when they can.
Status CheckSplit(int64_t num_rows, int num_shards, double validation_fraction);

// The validation slice SplitRows holds out of a shard of `size` rows: round(size * validation_fraction), always
// leaving one training row. Partitions (partition.h) cut their shards by the same rule.
int64_t ValidationRowsOf(int64_t size, double validation_fraction);

// The training rows of each shard SplitRows(num_rows, num_shards, validation_fraction, any seed) makes, without
// drawing the permutation: the sizes depend on the counts only. Empty when SplitRows would refuse.
std::vector<int64_t> ShardTrainRowCounts(int64_t num_rows, int num_shards, double validation_fraction);

// A warning, shown when a job is created, if the largest shard has more than 4x the training rows of the smallest:
// a round's workers run the same steps, so those on small shards repeat their rows many times per round. nullopt
// when the shards are even enough (always, for SplitRows' split of one dataset; other sources of shards may not be).
std::optional<std::string> UnevenShardsWarning(const std::vector<int64_t>& shard_train_rows);

}  // namespace parsyn::coordinator
