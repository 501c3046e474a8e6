// ChooseParticipants: whom a round trains, shared by every strategy's ConfigureRound (client sampling included).
// Pure and deterministic; safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "strategy/strategy.h"

namespace parsyn::strategy {

// Empty (keep waiting) when fewer than ctx.min_workers are available. Otherwise, sorted by shard:
//   - without sampling (ctx.sampling empty): every available worker when they fit in max_workers; otherwise
//     max_workers of them in shard order, starting at a window that moves by max_workers each round, so every shard
//     takes its turn;
//   - with sampling: k = clamp(ceil(fraction * available) or count, min_workers, max_workers), capped at the
//     available count; the k available workers whose shards rank first by SampleRank(job_seed, round, shard). A
//     shard's rank depends only on the job seed, the round and the shard, so the same job picks the same workers
//     (given the same available ones), and an extra available worker displaces only workers that rank after it.
// `rank` replaces SampleRank (dp_fedavg ranks under the job's private key, so that no one with the job spec can
// predict a round's sample).
using SampleRankFn = std::function<uint64_t(int64_t round, int64_t shard)>;
std::vector<ParticipantConfig> ChooseParticipants(const RoundContext& ctx, std::span<const Candidate> available,
                                                  const SampleRankFn& rank = nullptr);

// The sampling rank of `shard` in `round`: Mix64(Mix64(Mix64(job_seed ^ kSampleDomain) + round) + shard); lower
// ranks are chosen first.
uint64_t SampleRank(uint64_t job_seed, int64_t round, int64_t shard);

}  // namespace parsyn::strategy
