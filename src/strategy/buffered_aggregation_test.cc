#include "strategy/buffered_aggregation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "strategy/aggregating_strategy_for_test.h"
#include "strategy/fed_avg.h"
#include "strategy/server_optimizer.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::WeightSet;

WeightSet F32(const std::vector<float>& values) {
  WeightSet set;
  EXPECT_TRUE(set.Add("w", DType::kF32, {static_cast<int64_t>(values.size())}, std::as_bytes(std::span(values))).ok());
  return set;
}

std::vector<float> Values(const WeightSet& set) {
  auto v = set[0].as<float>();
  return {v.begin(), v.end()};
}

TEST(StalenessWeightTest, PolynomialShrinksWithStalenessAndConstantDoesNot) {
  const StalenessWeighting polynomial{.rule = StalenessWeighting::Rule::kPolynomial, .exponent = 0.5};
  EXPECT_DOUBLE_EQ(StalenessWeight(polynomial, 0), 1.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(polynomial, 3), 0.5);  // (1 + 3)^-0.5
  EXPECT_DOUBLE_EQ(StalenessWeight({.exponent = 1.0}, 4), 0.2);
  const StalenessWeighting constant{.rule = StalenessWeighting::Rule::kConstant};
  EXPECT_DOUBLE_EQ(StalenessWeight(constant, 19), 1.0);
  EXPECT_EQ(DescribeStalenessWeighting(polynomial), "polynomial (1 + s)^-0.5");
  EXPECT_EQ(DescribeStalenessWeighting(constant), "constant");
}

TEST(RebaseUpdateTest, MovesAStaleUpdatesChangeOntoTheCurrentGlobal) {
  WeightSet update = F32({1.5f, -2.0f});
  ASSERT_TRUE(RebaseUpdate(update, F32({1.0f, -1.0f}), F32({3.0f, 0.0f})).ok());
  EXPECT_EQ(Values(update), (std::vector<float>{3.5f, -1.0f}));  // current + (update - base)
}

TEST(RebaseUpdateTest, RoundsIntoTheUpdatesOwnDtype) {
  auto bf16 = [](float a) {
    std::vector<uint16_t> v = {weights::FloatToBf16(a)};
    WeightSet set;
    EXPECT_TRUE(set.Add("w", DType::kBF16, {1}, std::as_bytes(std::span(v))).ok());
    return set;
  };
  WeightSet update = bf16(2.0f);
  ASSERT_TRUE(RebaseUpdate(update, bf16(1.0f), bf16(0.5f)).ok());
  EXPECT_EQ(weights::LoadElement(update[0], 0), 1.5);
}

TEST(RebaseUpdateTest, RefusesOtherLayoutsAndChangesNothing) {
  WeightSet update = F32({1.0f, 2.0f});
  const Status status = RebaseUpdate(update, F32({0.0f, 0.0f, 0.0f}), F32({1.0f, 1.0f}));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rebasing a stale update"), std::string::npos) << status.message();
  EXPECT_EQ(Values(update), (std::vector<float>{1.0f, 2.0f}));
}

// One version of FedBuff through FedAvg: updates of staleness 0 and 3, weighted n * (1 + s)^-0.5, and eta 0.5:
// next = current + 0.5 * (n1 d1 + 0.5 n2 d2) / (n1 + 0.5 n2), with d the changes from each update's own base.
TEST(BufferedVersionTest, FedAvgAppliesTheStalenessWeightedMeanChangeScaledByTheServerLearningRate) {
  const WeightSet base_of_stale = F32({0.0f, 0.0f});
  const WeightSet current = F32({1.0f, 2.0f});
  AggregatingStrategy<FedAvg> fedavg;
  ASSERT_TRUE(fedavg.Begin(4, current).ok());
  ASSERT_TRUE(fedavg.Accept(F32({2.0f, 2.0f}), 10, StalenessWeight({}, 0)).ok());  // change (1, 0)
  WeightSet stale = F32({0.0f, 4.0f});                                             // change (0, 4) from base
  ASSERT_TRUE(RebaseUpdate(stale, base_of_stale, current).ok());
  ASSERT_TRUE(fedavg.Accept(stale, 20, StalenessWeight({}, 3)).ok());
  WeightSet next = fedavg.Finish().value();
  ASSERT_TRUE(ApplyServerLearningRate(next, current, 0.5).ok());
  // weights 10 and 20 * 0.5 = 10: mean change (0.5, 2), halved: (0.25, 1).
  const std::vector<float> got = Values(next);
  EXPECT_NEAR(got[0], 1.25f, 1e-6);
  EXPECT_NEAR(got[1], 3.0f, 1e-6);
}

TEST(BufferedVersionTest, AWeightScaleMustBePositive) {
  AggregatingStrategy<FedAvg> fedavg;
  ASSERT_TRUE(fedavg.Begin(1, F32({0.0f})).ok());
  EXPECT_EQ(fedavg.Accept(F32({1.0f}), 5, 0.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fedavg.Accept(F32({1.0f}), 5, std::nan("")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fedavg.num_accepted(), 0);
}

}  // namespace
}  // namespace parsyn::strategy
