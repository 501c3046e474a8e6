// RankGlobals: what a JobRunner (job_runner.h) holds of a LoRA job whose workers train different ranks
// (lora_rank_spec.h) for the attempt in progress: the rank each participant was given, and the global each rank below
// the job's r_max starts from — the committed global's best rank-r approximation (config.lora_aggregation "svd":
// weights::TruncateLoraRank) or its first r ranks ("zero_pad": weights::SliceLoraRank) — stored beside the attempt
// for the tasks' URLs and kept as the base its workers' updates are checked (and decoded) against.
//
// Threads: loop thread only (the job's runner); the weights are shared read-only with the pool's checks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "weights/weight_set.h"

namespace parsyn::coordinator {

class RankGlobals {
 public:
  struct Global {
    std::string key;
    std::string sha256;
    uint64_t size_bytes = 0;
    std::shared_ptr<weights::WeightSet> weights;
  };

  // A new attempt: no worker has a rank yet, and the globals of the last attempt are stale.
  void BeginAttempt() {
    ranks_.clear();
    globals_.clear();
  }

  void SetRank(int64_t worker_id, int rank) { ranks_[worker_id] = rank; }
  // The rank the worker's task of this attempt trains; nullopt before its task was prepared.
  std::optional<int> RankOf(int64_t worker_id) const {
    auto it = ranks_.find(worker_id);
    return it == ranks_.end() ? std::nullopt : std::optional<int>(it->second);
  }
  // The ranks given this attempt, by worker.
  const std::map<int64_t, int>& ranks() const { return ranks_; }

  // The attempt's global at `rank`; nullptr when not made yet.
  const Global* GlobalAt(int rank) const {
    auto it = globals_.find(rank);
    return it == globals_.end() ? nullptr : &it->second;
  }
  void AddGlobal(int rank, Global global) { globals_[rank] = std::move(global); }

 private:
  std::map<int64_t, int> ranks_;
  std::map<int, Global> globals_;
};

}  // namespace parsyn::coordinator
