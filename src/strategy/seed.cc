#include "strategy/seed.h"

namespace parsyn::strategy {
namespace {
// Arbitrary odd constants that separate the seed domains.
constexpr uint64_t kTaskDomain = 0x7461736b5f736565ULL;   // "task_see"
constexpr uint64_t kSplitDomain = 0x73706c69745f7364ULL;  // "split_sd"
}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t TaskSeed(uint64_t job_seed, int64_t round, int64_t shard) {
  uint64_t x = Mix64(job_seed ^ kTaskDomain);
  x = Mix64(x + static_cast<uint64_t>(round));
  return Mix64(x + static_cast<uint64_t>(shard));
}

uint64_t SplitSeed(uint64_t job_seed) { return Mix64(job_seed ^ kSplitDomain); }

}  // namespace parsyn::strategy
