#include "secagg/quantization.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "secagg/ring.h"

namespace parsyn::secagg {
namespace {

TEST(QuantizationTest, TheSumOfQuantizedUpdatesGivesTheMeanWeightedBySampleCount) {
  for (int bits : {8, 16}) {
    const Quantization q{bits, 1.0};
    std::mt19937 rng(static_cast<unsigned>(bits));
    std::normal_distribution<float> normal(0.f, 0.2f);
    const std::vector<double> samples = {120, 30, 75, 200};  // weights: samples over the bound 200
    const size_t length = 4000;
    std::vector<std::vector<float>> updates(samples.size(), std::vector<float>(length));
    std::vector<uint32_t> sum(length + 1, 0);
    for (size_t w = 0; w < samples.size(); ++w) {
      for (float& v : updates[w]) v = normal(rng);
      auto quantized = QuantizeUpdate(updates[w], samples[w] / 200, q, *RandomKey());
      ASSERT_TRUE(quantized.ok()) << quantized.status().ToString();
      ASSERT_EQ(quantized->size(), length + 1);
      AddInto(sum, *quantized, 32);
    }
    auto mean = DequantizeMean(sum, samples.size(), q);
    ASSERT_TRUE(mean.ok()) << mean.status().ToString();
    EXPECT_NEAR(mean->weight_sum, (120 + 30 + 75 + 200) / 200.0, 4.0 / ((1 << bits) - 1));
    double total = 0;
    for (double s : samples) total += s;
    double error_sq = 0, bias = 0;
    for (size_t i = 0; i < length; ++i) {
      double exact = 0;
      for (size_t w = 0; w < samples.size(); ++w) exact += samples[w] * updates[w][i];
      exact /= total;
      error_sq += (mean->mean[i] - exact) * (mean->mean[i] - exact);
      bias += mean->mean[i] - exact;
    }
    // Each worker adds at most one level (2c / L) of rounding error per value, unbiased.
    const double step = 2.0 / ((1 << bits) - 1);
    EXPECT_LT(std::sqrt(error_sq / length), step) << bits << " bits";
    EXPECT_LT(std::abs(bias / length), 4 * step / std::sqrt(static_cast<double>(length))) << bits << " bits";
  }
}

TEST(QuantizationTest, ValuesAreClippedToTheRange) {
  const Quantization q{16, 0.5};
  const std::vector<float> update = {3.f, -3.f, 0.25f};
  std::vector<uint32_t> sum = *QuantizeUpdate(update, 1.0, q, *RandomKey());
  EXPECT_EQ(sum[0], 65535u);
  EXPECT_EQ(sum[1], 0u);
  EXPECT_EQ(sum[3], 65535u);  // weight 1
  const DequantizedMean mean = *DequantizeMean(sum, 1, q);
  EXPECT_FLOAT_EQ(mean.mean[0], 0.5f);
  EXPECT_FLOAT_EQ(mean.mean[1], -0.5f);
  EXPECT_NEAR(mean.mean[2], 0.25f, 2.0 / 65535);
}

TEST(QuantizationTest, ClipAndAddNoiseBoundsTheNormAndAddsNoiseOfTheGivenSpread) {
  std::vector<float> change(20000, 0.1f);  // norm 0.1 * sqrt(20000) = 14.1
  ASSERT_TRUE(ClipAndAddNoise(change, 2.0, 0.0, Key32{}).ok());
  double norm_sq = 0;
  for (float v : change) norm_sq += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(norm_sq), 2.0, 1e-4);
  std::vector<float> small(20000, 0.0f), same(20000, 0.0f);
  small[0] = 0.5f;
  same[0] = 0.5f;
  const Key32 key = *RandomKey();
  ASSERT_TRUE(ClipAndAddNoise(small, 2.0, 0.3, key).ok());  // below the norm: not scaled
  ASSERT_TRUE(ClipAndAddNoise(same, 2.0, 0.3, key).ok());
  EXPECT_EQ(small, same);  // the key decides the noise
  double sum = 0, sum_sq = 0;
  for (size_t i = 1; i < small.size(); ++i) {
    sum += small[i];
    sum_sq += static_cast<double>(small[i]) * small[i];
  }
  const double n = static_cast<double>(small.size() - 1);
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 0.3, 0.01);
  EXPECT_EQ(ClipAndAddNoise(small, 0.0, 0.3, key).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClipAndAddNoise(small, 1.0, -1.0, key).code(), StatusCode::kInvalidArgument);
}

TEST(QuantizationTest, WhatIsNotAnUpdateOrASumOfUpdatesIsRefused) {
  const Quantization q{8, 1.0};
  const std::vector<float> update = {0.f, 1.f};
  EXPECT_EQ(QuantizeUpdate(update, 0.0, q, Key32{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeUpdate(update, 1.5, q, Key32{}).status().code(), StatusCode::kInvalidArgument);
  const std::vector<float> bad = {std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(QuantizeUpdate(bad, 1.0, q, Key32{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeUpdate(update, 1.0, Quantization{12, 1.0}, Key32{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeUpdate(update, 1.0, Quantization{8, 0.0}, Key32{}).status().code(), StatusCode::kInvalidArgument);
  // Two contributors add up to at most 2 * 255 per element.
  const std::vector<uint32_t> too_big = {511, 10, 300};
  const Status status = DequantizeMean(too_big, 2, q).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("element 0"), std::string::npos) << status.ToString();
  const std::vector<uint32_t> no_weight = {10, 0};
  EXPECT_EQ(DequantizeMean(no_weight, 1, q).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::secagg
