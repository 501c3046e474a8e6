// Tests only: AggregatingStrategy<S>, a concrete strategy S and the RoundAggregation over it as one object, so a test
// drives a round (Begin, Accept, Finish) and reads the strategy's own hooks (state, privacy) on the same name.
#pragma once

#include <utility>

#include "strategy/round_aggregation.h"
#include "strategy/strategy.h"

namespace parsyn::strategy {

template <typename S>
class AggregatingStrategy : public S, public RoundAggregation {
 public:
  // S's constructor arguments.
  template <typename... Args>
  explicit AggregatingStrategy(Args&&... args)
      : S(std::forward<Args>(args)...), RoundAggregation(static_cast<Strategy&>(*this)) {}

  AggregatingStrategy(const AggregatingStrategy&) = delete;
  AggregatingStrategy& operator=(const AggregatingStrategy&) = delete;
};

}  // namespace parsyn::strategy
