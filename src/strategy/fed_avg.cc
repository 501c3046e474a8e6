#include "strategy/fed_avg.h"

#include <string>

#include "strategy/sampling.h"

namespace parsyn::strategy {

FedAvg::FedAvg(FedAvgOptions options) : options_(options) {}

std::vector<ParticipantConfig> FedAvg::ConfigureRound(const RoundContext& ctx,
                                                      std::span<const Candidate> available) const {
  return ChooseParticipants(ctx, available);
}

StatusOr<RoundPlan> FedAvg::BeginRound(int /*round*/, const weights::WeightSet& global) {
  for (const weights::Tensor& t : global.tensors()) {
    if (!weights::IsFloat(t.dtype)) {
      return InvalidArgumentError("global tensor '" + t.name + "' has dtype " +
                                  std::string(weights::DTypeName(t.dtype)) + "; FedAvg averages float tensors only");
    }
  }
  return RoundPlan{.combination = Combination::kWeightedMean,
                   .weighted_by_sample_count = true,
                   .mean_options = {.accumulation = options_.accumulation, .num_threads = options_.num_threads}};
}

}  // namespace parsyn::strategy
