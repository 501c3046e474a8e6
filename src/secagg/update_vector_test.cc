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

}  // namespace
}  // namespace parsyn::secagg
