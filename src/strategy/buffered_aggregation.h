// Asynchronous buffered aggregation's rule (FedBuff, Nguyen et al. 2022): workers train whatever global version is
// the latest when they ask for work, and each finished update joins a buffer; once K updates are buffered, the server
// applies the learning rate times their weighted mean change to the current global, which becomes the next version.
//
// An update trained from version b, buffered while version c is current, has staleness c - b. Its change is its weights
// minus global b; its weight is its sample count (or 1, as the strategy plans) times StalenessWeight(staleness). The
// buffer aggregates through a RoundAggregation begun on global c like any round, with each update first re-expressed
// against global c (RebaseUpdate: w + (global c - global b)), so the strategy's weighted mean of weights is global c
// plus the weighted mean change, and a server optimizer's pseudo-gradient is that mean change. The server learning
// rate is applied to what the strategy finishes with (ApplyServerLearningRate): next = c + eta (finished - c). With
// staleness 0, eta 1 and FedAvg, a version is exactly FedAvg's round over the buffered updates.
//
// Pure functions over weights; no state. Used by the coordinator's asynchronous jobs and by bench_learning.
#pragma once

#include <string>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::strategy {

// How an update's weight shrinks with its staleness s (versions committed since the one it trained on):
// kPolynomial: (1 + s)^(-exponent), FLSim's polynomial rule; kConstant: 1 (staleness ignored).
struct StalenessWeighting {
  enum class Rule { kPolynomial, kConstant };
  Rule rule = Rule::kPolynomial;
  double exponent = 0.5;
};

// The factor an update of `staleness` (>= 0) versions is weighted by, in (0, 1].
double StalenessWeight(const StalenessWeighting& weighting, int staleness);

// "polynomial (1 + s)^-0.5" or "constant": for people (events, job pages).
std::string DescribeStalenessWeighting(const StalenessWeighting& weighting);

// update <- update + (current - base), value by value (float tensors; computed in double, stored in the update's
// dtype). InvalidArgument when the three layouts differ (names, dtypes, shapes), changing nothing.
Status RebaseUpdate(weights::WeightSet& update, const weights::WeightSet& base, const weights::WeightSet& current);

// finished <- current + eta * (finished - current), value by value (float tensors); eta 1 leaves it unchanged.
// InvalidArgument when the layouts differ, changing nothing.
Status ApplyServerLearningRate(weights::WeightSet& finished, const weights::WeightSet& current, double eta);

}  // namespace parsyn::strategy
