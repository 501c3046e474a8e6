#include "strategy/sampling.h"

#include <algorithm>
#include <cmath>

#include "strategy/seed.h"

namespace parsyn::strategy {
namespace {
constexpr uint64_t kSampleDomain = 0x73616d706c652d31ULL;  // "sample-1": apart from the task and split seeds
}  // namespace

uint64_t SampleRank(uint64_t job_seed, int64_t round, int64_t shard) {
  return Mix64(Mix64(Mix64(job_seed ^ kSampleDomain) + static_cast<uint64_t>(round)) + static_cast<uint64_t>(shard));
}

std::vector<ParticipantConfig> ChooseParticipants(const RoundContext& ctx, std::span<const Candidate> available,
                                                  const SampleRankFn& rank) {
  const size_t min_workers = static_cast<size_t>(std::max(ctx.min_workers, 1));
  const size_t max_workers = std::max(static_cast<size_t>(std::max(ctx.max_workers, 1)), min_workers);
  if (available.size() < min_workers) return {};

  std::vector<Candidate> by_shard(available.begin(), available.end());
  std::sort(by_shard.begin(), by_shard.end(), [](const Candidate& a, const Candidate& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.worker_id < b.worker_id;
  });
  const size_t n = by_shard.size();

  std::vector<Candidate> chosen;
  if (ctx.sampling.fraction || ctx.sampling.count) {
    size_t k = ctx.sampling.count ? static_cast<size_t>(std::max(*ctx.sampling.count, 1))
                                  : static_cast<size_t>(std::ceil(*ctx.sampling.fraction * static_cast<double>(n)));
    k = std::min(std::clamp(k, min_workers, max_workers), n);
    std::vector<std::pair<uint64_t, Candidate>> ranked;
    ranked.reserve(n);
    for (const Candidate& c : by_shard) {
      ranked.push_back({rank ? rank(ctx.round, c.shard) : SampleRank(ctx.job_seed, ctx.round, c.shard), c});
    }
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < k; ++i) chosen.push_back(ranked[i].second);
  } else if (n <= max_workers) {
    chosen = std::move(by_shard);
  } else {
    // Rotate the window with the round so that, over rounds, every shard is trained, not only the lowest ones.
    const size_t start = (static_cast<size_t>(std::max(ctx.round - 1, 0)) * max_workers) % n;
    for (size_t i = 0; i < max_workers; ++i) chosen.push_back(by_shard[(start + i) % n]);
  }
  std::stable_sort(chosen.begin(), chosen.end(),
                   [](const Candidate& a, const Candidate& b) { return a.shard < b.shard; });

  std::vector<ParticipantConfig> participants;
  participants.reserve(chosen.size());
  for (const Candidate& c : chosen) {
    participants.push_back(
        {.worker_id = c.worker_id, .shard = c.shard, .seed = TaskSeed(ctx.job_seed, ctx.round, c.shard)});
  }
  return participants;
}

}  // namespace parsyn::strategy
