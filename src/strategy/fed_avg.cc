#include "strategy/fed_avg.h"

#include <algorithm>
#include <string>

#include "strategy/sampling.h"

namespace parsyn::strategy {

FedAvg::FedAvg(FedAvgOptions options) : options_(options) {}

std::vector<ParticipantConfig> FedAvg::ConfigureRound(const RoundContext& ctx,
                                                      std::span<const Candidate> available) const {
  return ChooseParticipants(ctx, available);
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

Status FedAvg::AcceptOwned(weights::WeightSet update, int64_t sample_count, std::optional<double> max_magnitude) {
  if (!begun_) return FailedPreconditionError("FedAvg::Accept before Begin");
  if (sample_count <= 0) {
    return InvalidArgumentError("sample count must be positive, got " + std::to_string(sample_count));
  }
  return mean_->AcceptOwned(std::move(update), static_cast<double>(sample_count), max_magnitude)
      .WithContext("round " + std::to_string(round_) + " update");
}

bool FedAvg::AcceptOwnedIsQuick(const weights::WeightSet& update) const {
  return !begun_ || mean_->AcceptOwnedIsQuick(update);
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
