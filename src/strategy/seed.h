// Seed derivation: every random choice of a job (the data split, each worker's per-round training seed) comes from
// the job seed through these functions, so a job run twice, or interrupted and resumed, makes the same choices.
// Pure functions; safe from any thread. The values are part of the reproducibility contract: changing them changes
// what every existing job would compute on a rerun.
#pragma once

#include <cstdint>

namespace parsyn::strategy {

// SplitMix64's finaliser: a bijective, well-mixing map of 64 bits.
uint64_t Mix64(uint64_t x);

// The training seed of the worker that trains shard `shard` (0-based) in round `round` (1-based):
//   Mix64(Mix64(Mix64(job_seed ^ kTaskDomain) + round) + shard)
// Distinct for distinct (round, shard) of a job with overwhelming probability. A retried round (a new attempt) gets
// the same seeds, so a retry with the same participants trains exactly as the failed attempt would have.
uint64_t TaskSeed(uint64_t job_seed, int64_t round, int64_t shard);

// The seed of the job's data split (sharding); a separate domain from TaskSeed so the two never coincide.
uint64_t SplitSeed(uint64_t job_seed);

// dp_fedavg's noise and sample are not derived from the job seed, which the job spec shows: they are drawn under the
// job's private key (strategy/dp_fed_avg.h).

}  // namespace parsyn::strategy
