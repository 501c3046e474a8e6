#include "secagg/update_vector.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace parsyn::secagg {
namespace {

using weights::DType;
using weights::WeightSet;

// A set of an F32 [2, 3] "a", an I64 [2] "steps" and a BF16 [4] "b", the float values from `first` on.
WeightSet Weights(float first) {
  WeightSet set;
  auto a = *set.AddZeros("a", DType::kF32, {2, 3});
  auto steps = *set.AddZeros("steps", DType::kI64, {2});
  auto b = *set.AddZeros("b", DType::kBF16, {4});
  (void)a, (void)steps, (void)b;
  for (int64_t i = 0; i < 6; ++i) weights::StoreElement(set[0], i, first + 0.5 * static_cast<double>(i));
  set[1].as<int64_t>()[0] = 7;
  for (int64_t i = 0; i < 4; ++i) weights::StoreElement(set[2], i, first - 0.25 * static_cast<double>(i));
  return set;
}

TEST(UpdateVectorTest, TheChangeOfTheFloatTensorsInOrderAndBackIntoWeights) {
  const WeightSet global = Weights(1.0f), trained = Weights(1.5f);
  EXPECT_EQ(UpdateVectorLength(global), 10u);
  auto change = UpdateVector(global, trained);
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_EQ(*change, std::vector<float>(10, 0.5f));
  auto back = ApplyUpdateVector(global, *change);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->CheckSameLayout(trained).ok());
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(std::memcmp((*back)[k].data.data(), trained[k].data.data(), trained[k].data.size()), 0) << k;
  }
}

TEST(UpdateVectorTest, ChangesToTensorsThatAreNotExchangedAndOtherLayoutsAreRefused) {
  const WeightSet global = Weights(1.0f);
  WeightSet trained = Weights(1.0f);
  trained[1].as<int64_t>()[0] = 8;
  EXPECT_EQ(UpdateVector(global, trained).status().code(), StatusCode::kInvalidArgument);
  WeightSet other;
  (void)*other.AddZeros("a", DType::kF32, {6});
  EXPECT_EQ(UpdateVector(global, other).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyUpdateVector(global, std::vector<float>(9)).status().code(), StatusCode::kInvalidArgument);
}

TEST(UpdateVectorTest, TheSecureSumOfQuantizedUpdatesGivesTheSampleWeightedMean) {
  const WeightSet global = Weights(1.0f);
  const std::vector<std::pair<float, int64_t>> workers = {{1.5f, 30}, {0.5f, 10}, {2.0f, 60}};  // trained from, samples
  std::vector<uint32_t> sum(UpdateVectorLength(global) + 1, 0);
  for (const auto& [from, samples] : workers) {
    auto q = QuantizedUpdate(global, Weights(from), samples, 60, {16, 2.0}, *RandomKey());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += (*q)[i];
  }
  auto mean = MeanFromSecureSum(global, sum, workers.size(), 60, {16, 2.0});
  ASSERT_TRUE(mean.ok()) << mean.status().ToString();
  EXPECT_NEAR(mean->total_samples, 100, 0.01);
  // Every float changes by (30 * 0.5 + 10 * -0.5 + 60 * 1.0) / 100 = 0.7.
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(weights::LoadElement(mean->weights[0], i), weights::LoadElement(global[0], i) + 0.7, 1e-3);
  }
  EXPECT_EQ(mean->weights[1].as<int64_t>()[0], 7);
  EXPECT_EQ(QuantizedUpdate(global, Weights(1.5f), 61, 60, {16, 2.0}, Key32{}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MeanFromSecureSum(global, std::vector<uint32_t>(3), 1, 60, {16, 2.0}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::secagg
