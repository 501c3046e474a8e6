#include "strategy/fed_avg.h"

#include <algorithm>
#include <string>

#include "strategy/seed.h"

namespace parsyn::strategy {

FedAvg::FedAvg(FedAvgOptions options) : options_(options) {}

std::vector<ParticipantConfig> FedAvg::ConfigureRound(const RoundContext& ctx,
                                                      std::span<const Candidate> available) const {
  const size_t min_workers = static_cast<size_t>(std::max(ctx.min_workers, 1));
  const size_t max_workers = std::max(static_cast<size_t>(std::max(ctx.max_workers, 1)), min_workers);
  if (available.size() < min_workers) return {};

  std::vector<Candidate> by_shard(available.begin(), available.end());
  std::sort(by_shard.begin(), by_shard.end(), [](const Candidate& a, const Candidate& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.worker_id < b.worker_id;
  });

  std::vector<Candidate> chosen;
  if (by_shard.size() <= max_workers) {
    chosen = std::move(by_shard);
  } else {
    // Rotate the window with the round so that, over rounds, every shard is trained, not only the lowest ones.
    const size_t n = by_shard.size();
    const size_t start = (static_cast<size_t>(std::max(ctx.round - 1, 0)) * max_workers) % n;
    for (size_t i = 0; i < max_workers; ++i) chosen.push_back(by_shard[(start + i) % n]);
    std::sort(chosen.begin(), chosen.end(), [](const Candidate& a, const Candidate& b) { return a.shard < b.shard; });
  }

  std::vector<ParticipantConfig> participants;
  participants.reserve(chosen.size());
  for (const Candidate& c : chosen) {
    participants.push_back(
        {.worker_id = c.worker_id, .shard = c.shard, .seed = TaskSeed(ctx.job_seed, ctx.round, c.shard)});
  }
  return participants;
}

Status FedAvg::Begin(int round, const weights::WeightSet& global) {
  for (const weights::Tensor& t : global.tensors()) {
    if (!weights::IsFloat(t.dtype)) {
      return InvalidArgumentError("global tensor '" + t.name + "' has dtype " +
                                  std::string(weights::DTypeName(t.dtype)) + "; FedAvg averages float tensors only");
    }
  }
  round_ = round;
  // Every round of a job has the global's layout: the sums of the last round are reused, not allocated anew.
  if (mean_ && mean_->CheckLayout(global).ok()) {
    mean_->Reset();
  } else {
    mean_.reset();
    mean_.emplace(global, weights::WeightedMeanOptions{.accumulation = options_.accumulation,
                                                       .num_threads = options_.num_threads});
  }
  begun_ = true;
  return Status::Ok();
}

Status FedAvg::Accept(const weights::WeightSet& update, int64_t sample_count) {
  if (!begun_) return FailedPreconditionError("FedAvg::Accept before Begin");
  if (sample_count <= 0) {
    return InvalidArgumentError("sample count must be positive, got " + std::to_string(sample_count));
  }
  // WeightedMean checks names, dtypes, shapes and finiteness, and adds nothing when any check fails.
  return mean_->Accept(update, static_cast<double>(sample_count))
      .WithContext("round " + std::to_string(round_) + " update");
}

Status FedAvg::AcceptOwned(weights::WeightSet update, int64_t sample_count) {
  if (!begun_) return FailedPreconditionError("FedAvg::Accept before Begin");
  if (sample_count <= 0) {
    return InvalidArgumentError("sample count must be positive, got " + std::to_string(sample_count));
  }
  return mean_->AcceptOwned(std::move(update), static_cast<double>(sample_count))
      .WithContext("round " + std::to_string(round_) + " update");
}

void FedAvg::AddKeptUpdates() {
  if (begun_) mean_->AddKept();
}

int FedAvg::num_accepted() const { return begun_ ? mean_->num_accepted() : 0; }

StatusOr<weights::WeightSet> FedAvg::Finish() {
  if (!begun_) return FailedPreconditionError("FedAvg::Finish before Begin");
  if (mean_->num_accepted() == 0) {
    return FailedPreconditionError("round " + std::to_string(round_) + " has no accepted update to average");
  }
  begun_ = false;
  return std::move(*mean_).Finish();  // mean_ stays, finished, for the next Begin to reuse
}

}  // namespace parsyn::strategy
