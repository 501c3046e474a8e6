#include "strategy/buffered_aggregation.h"

#include <cmath>
#include <cstdio>

namespace parsyn::strategy {

double StalenessWeight(const StalenessWeighting& weighting, int staleness) {
  if (weighting.rule == StalenessWeighting::Rule::kConstant || staleness <= 0) return 1.0;
  return std::pow(1.0 + staleness, -weighting.exponent);
}

std::string DescribeStalenessWeighting(const StalenessWeighting& weighting) {
  if (weighting.rule == StalenessWeighting::Rule::kConstant) return "constant";
  char text[64];
  std::snprintf(text, sizeof text, "polynomial (1 + s)^-%g", weighting.exponent);
  return text;
}

namespace {

// Every float tensor of `out`, element by element: out[i] = f(out[i], others[k][i]...).
template <typename F>
Status ForEachFloatValue(weights::WeightSet& out, std::initializer_list<const weights::WeightSet*> others, F f,
                         const char* what) {
  for (const weights::WeightSet* other : others) {
    if (Status same = weights::CheckLayoutMatches(other->tensors(), out); !same.ok()) return same.WithContext(what);
  }
  for (size_t t = 0; t < out.size(); ++t) {
    const weights::Tensor& o = out[t];
    if (!weights::IsFloat(o.dtype)) continue;
    const int64_t n = o.numel();
    for (int64_t i = 0; i < n; ++i) {
      double args[2] = {0, 0};
      size_t k = 0;
      for (const weights::WeightSet* other : others) args[k++] = weights::LoadElement((*other)[t], i);
      weights::StoreElement(o, i, f(weights::LoadElement(o, i), args[0], args[1]));
    }
  }
  return Status::Ok();
}

}  // namespace

Status RebaseUpdate(weights::WeightSet& update, const weights::WeightSet& base, const weights::WeightSet& current) {
  return ForEachFloatValue(
      update, {&base, &current}, [](double w, double b, double c) { return w + (c - b); },
      "rebasing a stale update onto the current global");
}

Status ApplyServerLearningRate(weights::WeightSet& finished, const weights::WeightSet& current, double eta) {
  if (eta == 1.0) return weights::CheckLayoutMatches(current.tensors(), finished);
  return ForEachFloatValue(
      finished, {&current}, [eta](double f, double c, double) { return c + eta * (f - c); },
      "applying the server learning rate");
}

}  // namespace parsyn::strategy
