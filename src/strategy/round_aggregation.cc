#include "strategy/round_aggregation.h"

#include <string>
#include <utility>

namespace parsyn::strategy {

RoundAggregation::RoundAggregation(Strategy& strategy) : strategy_(strategy) {}

Status RoundAggregation::Begin(int round, const weights::WeightSet& global) {
  PARSYN_ASSIGN_OR_RETURN(const RoundPlan plan, strategy_.BeginRound(round, global));
  layout_.clear();
  for (const weights::Tensor& t : global.tensors()) layout_.push_back({t.name, t.dtype, t.shape});
  kept_.clear();
  if (plan.combination == Combination::kWeightedMean) {
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

Status RoundAggregation::Validate(const weights::WeightSet& update, int64_t sample_count) const {
  if (!begun_) return FailedPreconditionError(std::string(strategy_.name()) + ": Accept before Begin");
  if (sample_count <= 0) {
    return InvalidArgumentError("sample count must be positive, got " + std::to_string(sample_count));
  }
  // A plain weighted mean checks the layout and the values itself as it takes the update (with a known magnitude,
  // without reading the values): nothing is added before the whole update passed.
  if (combination_ == Combination::kWeightedMean && !transforms_updates_) return Status::Ok();
  if (Status layout = weights::CheckLayoutMatches(layout_, update); !layout.ok()) {
    return layout.WithContext(UpdateContext());
  }
  if (Status finite = weights::CheckFinite(update); !finite.ok()) return finite.WithContext(UpdateContext());
  return Status::Ok();
}

double RoundAggregation::WeightOf(int64_t sample_count) const {
  return weighted_by_sample_count_ ? static_cast<double>(sample_count) : 1.0;
}

Status RoundAggregation::AddTransformed(const weights::WeightSet& update, int64_t sample_count) {
  const double weight = WeightOf(sample_count);
  return strategy_
      .TransformUpdate(update,
                       [&](const weights::WeightSet& transformed) { return mean_->Accept(transformed, weight); })
      .WithContext(UpdateContext());
}

Status RoundAggregation::Accept(const weights::WeightSet& update, int64_t sample_count) {
  PARSYN_RETURN_IF_ERROR(Validate(update, sample_count));
  if (combination_ == Combination::kKeepAll) {
    kept_.push_back({update.Clone(), sample_count});
    return Status::Ok();
  }
  if (transforms_updates_) return AddTransformed(update, sample_count);
  return mean_->Accept(update, WeightOf(sample_count)).WithContext(UpdateContext());
}

Status RoundAggregation::AcceptOwned(weights::WeightSet update, int64_t sample_count,
                                     std::optional<double> max_magnitude) {
  PARSYN_RETURN_IF_ERROR(Validate(update, sample_count));
  if (combination_ == Combination::kKeepAll) {
    kept_.push_back({std::move(update), sample_count});
    return Status::Ok();
  }
  if (transforms_updates_) return AddTransformed(update, sample_count);
  return mean_->AcceptOwned(std::move(update), WeightOf(sample_count), max_magnitude).WithContext(UpdateContext());
}

bool RoundAggregation::AcceptOwnedIsQuick(const weights::WeightSet& update) const {
  if (!begun_) return true;  // refused at once
  return combination_ == Combination::kWeightedMean && !transforms_updates_ && mean_->AcceptOwnedIsQuick(update);
}

void RoundAggregation::AddKeptUpdates() {
  if (begun_ && mean_) mean_->AddKept();
}

int RoundAggregation::num_accepted() const {
  if (!begun_) return 0;
  return combination_ == Combination::kKeepAll ? static_cast<int>(kept_.size()) : mean_->num_accepted();
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
  begun_ = false;
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet mean, std::move(*mean_).Finish());  // mean_ stays for the next Begin
  return strategy_.FinishFromMean(std::move(mean), count);
}

}  // namespace parsyn::strategy
