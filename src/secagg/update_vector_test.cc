#include "secagg/update_vector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// dp_fedavg under secure aggregation: each worker clips its change and adds its noise; the sum's mean is unweighted and
// comes back as float32 deltas of the float tensors.
TEST(UpdateVectorTest, NoisedUpdatesSumToTheUnweightedMeanOfTheClippedChangesAsDeltas) {
  const WeightSet global = Weights(1.0f);
  const InputRule rule{.sample_bound = 1, .noise = DistributedNoise{.clip_norm = 1.0, .noise_stddev = 0.0}};
  const Quantization quantization{16, 2.0};
  std::vector<uint32_t> sum(UpdateVectorLength(global) + 1, 0);
  // Changes of about 0.5 and 0.1 in each of 10 values (the bf16 tensor rounds them): norms about 1.58 (clipped to 1)
  // and 0.316 (kept).
  std::vector<double> expected(UpdateVectorLength(global), 0.0);
  for (const float from : {1.5f, 1.1f}) {
    const std::vector<float> change = *UpdateVector(global, Weights(from));
    double norm_sq = 0;
    for (float v : change) norm_sq += double(v) * v;
    for (size_t i = 0; i < change.size(); ++i) expected[i] += change[i] * std::min(1.0, 1.0 / std::sqrt(norm_sq)) / 2;
    auto q = QuantizedInput(global, Weights(from), /*samples=*/900, rule, quantization, *RandomKey(), *RandomKey());
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += (*q)[i];
  }
  auto mean = MeanFromSecureSum(global, sum, 2, rule.sample_bound, quantization, SecureMeanForm::kDelta);
  ASSERT_TRUE(mean.ok()) << mean.status().ToString();
  EXPECT_NEAR(mean->total_samples, 2, 1e-3);  // unweighted: the survivors
  ASSERT_EQ(mean->weights.size(), 2u);        // the float tensors only, as float32
  EXPECT_EQ(mean->weights[0].name, "a");
  EXPECT_EQ(mean->weights[1].name, "b");
  EXPECT_EQ(mean->weights[1].dtype, DType::kF32);
  EXPECT_GT(expected[0], 0.2);  // 0.5 / sqrt(2.5) and 0.1, averaged: the first is clipped
  size_t at = 0;
  for (size_t k = 0; k < 2; ++k) {
    for (float v : mean->weights[k].as<float>()) EXPECT_NEAR(v, expected[at++], 1e-4) << at;
  }
  // Noise: a fresh key gives a different input of the same change; noise of spread 0.2 moves values by about that.
  const InputRule noisy{.sample_bound = 1, .noise = DistributedNoise{.clip_norm = 1.0, .noise_stddev = 0.2}};
  auto a = QuantizedInput(global, Weights(1.1f), 1, noisy, quantization, Key32{}, *RandomKey());
  auto b = QuantizedInput(global, Weights(1.1f), 1, rule, quantization, Key32{}, Key32{});
  ASSERT_TRUE(a.ok() && b.ok());
  double moved = 0;
  for (size_t i = 0; i + 1 < a->size(); ++i) moved += std::abs(double((*a)[i]) - double((*b)[i])) * 4.0 / 65535;
  EXPECT_GT(moved / 10, 0.05);
  EXPECT_EQ((*a).back(), (*b).back());  // the weight, 1, is not noised
}

}  // namespace
}  // namespace parsyn::secagg
