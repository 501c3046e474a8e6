#include "strategy/round_aggregation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "weights/lora_rank.h"

namespace parsyn::strategy {

RoundAggregation::RoundAggregation(Strategy& strategy, LoraRanks lora_ranks)
    : strategy_(strategy), lora_ranks_(lora_ranks) {}

Status RoundAggregation::Begin(int round, const weights::WeightSet& global) {
  PARSYN_ASSIGN_OR_RETURN(const RoundPlan plan, strategy_.BeginRound(round, global));
  const bool factored = lora_ranks_ == LoraRanks::kFactored;
  if (factored && (plan.combination != Combination::kWeightedMean || plan.transformed_layout != nullptr)) {
    return InvalidArgumentError(std::string(strategy_.name()) +
                                " cannot average LoRA updates of mixed ranks exactly (its new global is not the "
                                "updates' weighted mean): use zero-padding");
  }
  if (lora_ranks_ != LoraRanks::kSame) {
    PARSYN_ASSIGN_OR_RETURN(lora_base_rank_, weights::LoraRank(global));
    // kFactored: the global in its SVD form, whose ranks beyond a worker's fill its update (ExtendLoraRank).
    if (factored) {
      PARSYN_ASSIGN_OR_RETURN(lora_base_, weights::TruncateLoraRank(global, lora_base_rank_));
    } else {
      lora_base_ = global.Clone();
    }
  }
  factored_ = factored;
  layout_.clear();
  for (const weights::Tensor& t : global.tensors()) layout_.push_back({t.name, t.dtype, t.shape});
  kept_.clear();
  if (plan.combination == Combination::kWeightedMean && !factored) {
    const weights::WeightSet& mean_layout = plan.transformed_layout ? *plan.transformed_layout : global;
    // Every round of a job has the same layout: the sums of the last round are reused, not allocated anew.
    if (mean_ && mean_->CheckLayout(mean_layout).ok()) {
      mean_->Reset();
    } else {
      mean_.reset();
      mean_.emplace(mean_layout, plan.mean_options);
    }
  } else {
    mean_.reset();
  }
  combination_ = plan.combination;
  weighted_by_sample_count_ = plan.weighted_by_sample_count;
  transforms_updates_ = plan.transformed_layout != nullptr;
  round_ = round;
  begun_ = true;
  return Status::Ok();
}

std::string RoundAggregation::UpdateContext() const { return "round " + std::to_string(round_) + " update"; }

Status RoundAggregation::Validate(const weights::WeightSet& update, int64_t sample_count, double weight_scale) const {
  if (!begun_) return FailedPreconditionError(std::string(strategy_.name()) + ": Accept before Begin");
  if (sample_count <= 0) {
    return InvalidArgumentError("sample count must be positive, got " + std::to_string(sample_count));
  }
  if (!(weight_scale > 0) || !std::isfinite(weight_scale)) {
    return InvalidArgumentError("an update's weight scale must be positive, got " + std::to_string(weight_scale));
  }
  // A plain weighted mean checks the layout and the values itself as it takes the update (with a known magnitude,
  // without reading the values): nothing is added before the whole update passed. Kept updates (factored ones too,
  // at the global's rank by now) are checked here.
  if (combination_ == Combination::kWeightedMean && !transforms_updates_ && !factored_) return Status::Ok();
  if (Status layout = weights::CheckLayoutMatches(layout_, update); !layout.ok()) {
    return layout.WithContext(UpdateContext());
  }
  if (Status finite = weights::CheckFinite(update); !finite.ok()) return finite.WithContext(UpdateContext());
  return Status::Ok();
}

double RoundAggregation::WeightOf(int64_t sample_count, double weight_scale) const {
  return (weighted_by_sample_count_ ? static_cast<double>(sample_count) : 1.0) * weight_scale;
}

Status RoundAggregation::AddTransformed(const weights::WeightSet& update, double weight) {
  return strategy_
      .TransformUpdate(update,
                       [&](const weights::WeightSet& transformed) { return mean_->Accept(transformed, weight); })
      .WithContext(UpdateContext());
}

StatusOr<weights::WeightSet> RoundAggregation::ToGlobalRank(weights::WeightSet update) const {
  StatusOr<int64_t> rank = weights::CheckLoraLayoutUpToRank(lora_base_, update);
  if (!rank.ok()) return rank.status().WithContext(UpdateContext());
  if (*rank == lora_base_rank_) return update;
  // Trained at PEFT's scaling alpha / r: its products in the global's units (alpha / r_max) are r_max / r times its
  // own.
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet scaled,
                          weights::ScaleLoraProducts(update, static_cast<double>(lora_base_rank_) / *rank));
  if (lora_ranks_ == LoraRanks::kZeroPadded) return weights::ZeroPadLoraRank(scaled, lora_base_rank_);
  return weights::ExtendLoraRank(scaled, lora_base_);
}

Status RoundAggregation::Accept(const weights::WeightSet& update, int64_t sample_count, double weight_scale) {
  // Mixed ranks: a copy, brought to the global's rank by AcceptOwned.
  if (begun_ && lora_ranks_ != LoraRanks::kSame) {
    return AcceptOwned(update.Clone(), sample_count, std::nullopt, weight_scale);
  }
  PARSYN_RETURN_IF_ERROR(Validate(update, sample_count, weight_scale));
  if (combination_ == Combination::kKeepAll || factored_) {
    kept_.push_back({update.Clone(), sample_count, weight_scale});
    return Status::Ok();
  }
  if (transforms_updates_) return AddTransformed(update, WeightOf(sample_count, weight_scale));
  return mean_->Accept(update, WeightOf(sample_count, weight_scale)).WithContext(UpdateContext());
}

Status RoundAggregation::AcceptOwned(weights::WeightSet update, int64_t sample_count,
                                     std::optional<double> max_magnitude, double weight_scale) {
  if (begun_ && lora_ranks_ != LoraRanks::kSame) {
    PARSYN_ASSIGN_OR_RETURN(update, ToGlobalRank(std::move(update)));
  }
  PARSYN_RETURN_IF_ERROR(Validate(update, sample_count, weight_scale));
  if (combination_ == Combination::kKeepAll || factored_) {
    kept_.push_back({std::move(update), sample_count, weight_scale});
    return Status::Ok();
  }
  const double weight = WeightOf(sample_count, weight_scale);
  if (transforms_updates_) return AddTransformed(update, weight);
  return mean_->AcceptOwned(std::move(update), weight, max_magnitude).WithContext(UpdateContext());
}

bool RoundAggregation::AcceptOwnedIsQuick(const weights::WeightSet& update) const {
  if (!begun_) return true;  // refused at once
  return combination_ == Combination::kWeightedMean && !transforms_updates_ && lora_ranks_ == LoraRanks::kSame &&
         mean_->AcceptOwnedIsQuick(update);
}

void RoundAggregation::AddKeptUpdates() {
  if (begun_ && mean_) mean_->AddKept();
}

int RoundAggregation::num_accepted() const {
  if (!begun_) return 0;
  return combination_ == Combination::kKeepAll || factored_ ? static_cast<int>(kept_.size()) : mean_->num_accepted();
}

StatusOr<weights::WeightSet> RoundAggregation::Finish() {
  if (!begun_) return FailedPreconditionError(std::string(strategy_.name()) + ": Finish before Begin");
  const int count = num_accepted();
  const bool keeps = combination_ == Combination::kKeepAll;
  if (count == 0) {
    return FailedPreconditionError("round " + std::to_string(round_) + " has no accepted update to " +
                                   (keeps ? "aggregate" : "average"));
  }
  if (keeps) {
    StatusOr<weights::WeightSet> result = strategy_.FinishFromKept(kept_, layout_);
    if (!result.ok()) return result.status().WithContext("round " + std::to_string(round_));
    kept_.clear();  // releases copies and mappings now, not at the next Begin
    begun_ = false;
    return result;
  }
  if (factored_) return FinishFactored(count);
  begun_ = false;
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet mean, std::move(*mean_).Finish());  // mean_ stays for the next Begin
  return strategy_.FinishFromMean(std::move(mean), count);
}

namespace {

// A total order on updates by their contents (sample count, size, then bytes), so that the factored mean, whose
// rounding depends on the order its factors are stacked in, does not depend on the order updates arrived in.
bool ComesBefore(const KeptUpdate& a, const KeptUpdate& b) {
  if (a.sample_count != b.sample_count) return a.sample_count < b.sample_count;
  if (a.weights.total_bytes() != b.weights.total_bytes()) return a.weights.total_bytes() < b.weights.total_bytes();
  for (size_t i = 0; i < a.weights.size() && i < b.weights.size(); ++i) {
    const std::span<std::byte> x = a.weights[i].data, y = b.weights[i].data;
    if (x.size() != y.size()) return x.size() < y.size();
    if (const int c = std::memcmp(x.data(), y.data(), x.size()); c != 0) return c < 0;
  }
  return false;
}

}  // namespace

StatusOr<weights::WeightSet> RoundAggregation::FinishFactored(int count) {
  std::stable_sort(kept_.begin(), kept_.end(), ComesBefore);
  std::vector<weights::WeightedAdapter> adapters;
  adapters.reserve(kept_.size());
  for (const KeptUpdate& u : kept_)
    adapters.push_back({.adapter = &u.weights, .weight = WeightOf(u.sample_count, u.weight_scale)});
  StatusOr<weights::WeightSet> mean = weights::FactoredLoraMean(adapters, lora_base_);
  if (!mean.ok()) return mean.status().WithContext("round " + std::to_string(round_));
  kept_.clear();
  begun_ = false;
  return strategy_.FinishFromMean(std::move(*mean), count);
}

}  // namespace parsyn::strategy
