#include "weights/weighted_mean.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "weights/safetensors.h"
#include "weights/safetensors_stream_check.h"

namespace parsyn::weights {
namespace {

// Tensor names and shapes shared by every update in a test. One tensor is larger than the kernel's chunk and the
// total is above its threading threshold, so chunking and threads are exercised.
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
};
const std::vector<Spec> kSpecs = {{"emb.weight", {300, 1000}}, {"q.lora_A.weight", {8, 64}}, {"bias", {7}}, {"s", {}}};

// Rounds `values` through `dtype` and stores them; returns what the tensor now holds, as double.
std::vector<double> Store(std::span<std::byte> bytes, DType dtype, const std::vector<float>& values) {
  std::vector<double> stored(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(bytes.data() + 4 * i, &values[i], 4);
        stored[i] = values[i];
        break;
      case DType::kBF16: {
        uint16_t h = FloatToBf16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
        stored[i] = Bf16ToFloat(h);
        break;
      }
      default: {
        uint16_t h = FloatToF16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
        stored[i] = F16ToFloat(h);
      }
    }
  }
  return stored;
}

std::vector<double> ReadAsDouble(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h = 0;
    if (t.dtype != DType::kF32) std::memcpy(&h, t.data.data() + 2 * i, 2);
    out[i] = t.dtype == DType::kF32 ? t.as<float>()[i] : t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
  }
  return out;
}

// An update with values ~ N(center, 1) in `dtype`; `stored` receives the values as held (after rounding).
WeightSet RandomUpdate(DType dtype, uint32_t seed, std::vector<std::vector<double>>* stored = nullptr) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(static_cast<float>(seed % 5) - 2.0f, 1.0f);
  WeightSet set;
  for (const Spec& spec : kSpecs) {
    auto bytes = set.AddZeros(spec.name, dtype, spec.shape);
    EXPECT_TRUE(bytes.ok());
    std::vector<float> values(bytes->size() / DTypeSize(dtype));
    for (float& v : values) v = normal(rng);
    auto held = Store(*bytes, dtype, values);
    if (stored) stored->push_back(std::move(held));
  }
  return set;
}

// Half an ulp of `dtype` at |x| (plus the smallest subnormal step): the rounding of the final conversion.
double OutputRounding(DType dtype, double x) {
  const double magnitude = std::max(std::fabs(x), 1e-30);
  switch (dtype) {
    case DType::kF32: return std::ldexp(magnitude, -24);
    case DType::kBF16: return std::ldexp(magnitude, -8);
    default: return std::ldexp(magnitude, -11) + 0x1p-25;
  }
}

struct MeanCase {
  DType dtype;
  Accumulation accumulation;
  std::vector<double> weights;  // K = weights.size()
};

TEST(WeightedMeanTest, MatchesFloat64Reference) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  const Accumulation modes[] = {Accumulation::kFloat32, Accumulation::kFloat64, Accumulation::kExact};
  const std::vector<std::vector<double>> weight_sets = {{5}, {3, 1, 7.5}, {1, 10, 100, 1000, 2, 20, 200, 2000}};
  for (DType dtype : dtypes) {
    // Eight updates per dtype, shared by every mode and K (the first K are used).
    std::vector<WeightSet> updates;
    std::vector<std::vector<std::vector<double>>> held(8);
    for (uint32_t k = 0; k < 8; ++k) updates.push_back(RandomUpdate(dtype, k + 1, &held[k]));
    for (Accumulation mode : modes) {
      for (const auto& weights : weight_sets) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " mode " + std::to_string(static_cast<int>(mode)) +
                     " K=" + std::to_string(weights.size()));
        const size_t K = weights.size();
        WeightedMean mean(updates[0], {.accumulation = mode, .num_threads = 2});
        for (size_t k = 0; k < K; ++k) ASSERT_TRUE(mean.Accept(updates[k], weights[k]).ok());
        EXPECT_EQ(mean.num_accepted(), static_cast<int>(K));
        const double N = std::accumulate(weights.begin(), weights.end(), 0.0);
        EXPECT_DOUBLE_EQ(mean.total_weight(), N);
        auto result = std::move(mean).Finish();
        ASSERT_TRUE(result.ok()) << result.status().ToString();
        ASSERT_EQ(result->size(), kSpecs.size());
        double worst = 0;  // largest error in units of the allowed tolerance
        for (size_t t = 0; t < kSpecs.size(); ++t) {
          const Tensor& out = (*result)[t];
          EXPECT_EQ(out.dtype, dtype);
          EXPECT_EQ(out.shape, kSpecs[t].shape);
          std::vector<double> got = ReadAsDouble(out);
          for (size_t i = 0; i < got.size(); ++i) {
            double sum = 0, magnitude = 0;
            for (size_t k = 0; k < K; ++k) {
              sum += weights[k] * held[k][t][i];
              magnitude += weights[k] * std::fabs(held[k][t][i]);
            }
            const double ref = sum / N;
            // Tolerance: the output dtype's rounding, plus the accumulation's own error: fp32 sums lose up to
            // ~K ulps of the running magnitude; fp64 and exact sums are far below the fp32 output rounding.
            double tolerance = OutputRounding(dtype, ref) + 1e-12 * magnitude / N;
            if (mode == Accumulation::kFloat32) tolerance += 2.0 * K * std::ldexp(magnitude / N, -24);
            worst = std::max(worst, std::fabs(got[i] - ref) / tolerance);
          }
        }
        EXPECT_LE(worst, 1.0);
      }
    }
  }
}

TEST(WeightedMeanTest, OneUpdateIsReturnedBitForBitForEveryFiniteValue) {
  // Every finite BF16/F16 bit pattern (and a spread of F32 ones), averaged alone: exercises the kernels' own
  // conversions (loads, rounding back) against the exact identity.
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::vector<uint32_t> patterns;
    if (dtype == DType::kF32) {
      std::mt19937 rng(5);
      for (int i = 0; i < 100000; ++i) patterns.push_back(rng());
    } else {
      for (uint32_t h = 0; h < 0x10000; ++h) patterns.push_back(h);
    }
    const uint32_t exponent_mask = dtype == DType::kF32 ? 0x7f800000u : dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
    std::erase_if(patterns, [&](uint32_t p) { return (p & exponent_mask) == exponent_mask; });
    WeightSet update;
    auto bytes = update.AddZeros("all", dtype, {static_cast<int64_t>(patterns.size())});
    ASSERT_TRUE(bytes.ok());
    for (size_t i = 0; i < patterns.size(); ++i) {
      std::memcpy(bytes->data() + i * DTypeSize(dtype), &patterns[i], DTypeSize(dtype));  // little-endian
    }
    for (Accumulation mode : {Accumulation::kFloat32, Accumulation::kFloat64}) {
      WeightedMean mean(update, {.accumulation = mode, .num_threads = 2});
      ASSERT_TRUE(mean.Accept(update, 1.0).ok());
      auto result = std::move(mean).Finish();
      ASSERT_TRUE(result.ok());
      EXPECT_EQ(std::memcmp((*result)[0].data.data(), bytes->data(), bytes->size()), 0) << DTypeName(dtype);
    }
  }
}

TEST(WeightedMeanTest, ExactIsBitIdenticalAcrossArrivalOrders) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    constexpr int K = 6;
    std::vector<WeightSet> updates;
    for (int k = 0; k < K; ++k) updates.push_back(RandomUpdate(dtype, 50 + k));
    // Non-integer weights of very different sizes: exactly where floating-point sums depend on order.
    const double weights[K] = {0.1, 1234.5678, 3e-3, 77.7, 0.3, 1e5 / 3};
    std::vector<int> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::vector<std::byte> first_result;
    std::mt19937 rng(11);
    for (int trial = 0; trial < 10; ++trial) {
      std::shuffle(order.begin(), order.end(), rng);
      WeightedMean mean(updates[0], {.accumulation = Accumulation::kExact, .num_threads = 2});
      for (int k : order) ASSERT_TRUE(mean.Accept(updates[k], weights[k]).ok());
      auto result = std::move(mean).Finish();
      ASSERT_TRUE(result.ok());
      std::vector<std::byte> bytes;
      for (const Tensor& t : result->tensors()) bytes.insert(bytes.end(), t.data.begin(), t.data.end());
      if (trial == 0) {
        first_result = bytes;
      } else {
        ASSERT_EQ(bytes.size(), first_result.size());
        EXPECT_EQ(std::memcmp(bytes.data(), first_result.data(), bytes.size()), 0)
            << DTypeName(dtype) << " trial " << trial << " differs";
      }
    }
  }
}

// Deferred updates are added in batches; every element must still see the same additions in the same order.
TEST(WeightedMeanTest, AcceptOwnedIsBitIdenticalToAcceptOneByOne) {
  for (Accumulation accumulation : {Accumulation::kFloat32, Accumulation::kFloat64, Accumulation::kExact}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      constexpr int K = 8;
      const double weights[K] = {0.1, 1234.5678, 3e-3, 77.7, 0.3, 1e5 / 3, 5, 0.7};
      const uint64_t update_bytes = RandomUpdate(dtype, 1).total_bytes();
      WeightedMean one_by_one(RandomUpdate(dtype, 1), {.accumulation = accumulation, .num_threads = 2});
      // With max_deferred_bytes at 1.5 updates: #0-1 added by AddKept, #2-3 when the batch fills (on the batch's own
      // thread), #4 by a plain Accept (after that batch), #5-6 when the batch fills, #7 kept until Finish.
      WeightedMean batched(
          RandomUpdate(dtype, 1),
          {.accumulation = accumulation, .num_threads = 2, .max_deferred_bytes = update_bytes * 3 / 2});
      for (int k = 0; k < K; ++k) {
        ASSERT_TRUE(one_by_one.Accept(RandomUpdate(dtype, 70 + k), weights[k]).ok());
        Status s = k == 4 ? batched.Accept(RandomUpdate(dtype, 70 + k), weights[k])
                          : batched.AcceptOwned(RandomUpdate(dtype, 70 + k), weights[k]);
        ASSERT_TRUE(s.ok()) << s.ToString();
        if (k == 1) batched.AddKept();  // a caller with time on its hands adds the first two now
      }
      // A rejected update leaves the kept ones and the verdicts alone.
      WeightSet bad = RandomUpdate(dtype, 99);
      Store(bad.tensors()[0].data, dtype, {std::numeric_limits<float>::quiet_NaN()});
      EXPECT_EQ(batched.AcceptOwned(std::move(bad), 1.0).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(batched.num_accepted(), K);
      auto want = std::move(one_by_one).Finish();
      auto got = std::move(batched).Finish();
      ASSERT_TRUE(want.ok() && got.ok());
      for (size_t t = 0; t < want->size(); ++t) {
        ASSERT_EQ((*got)[t].data.size(), (*want)[t].data.size());
        EXPECT_EQ(std::memcmp((*got)[t].data.data(), (*want)[t].data.data(), (*want)[t].data.size()), 0)
            << DTypeName(dtype) << " accumulation " << static_cast<int>(accumulation) << " tensor " << t;
      }
    }
  }
}

// A batch still being added on its own thread when the mean is reset, finished or destroyed is waited for: the reset
// mean's next result has the bits of a fresh one, and nothing outlives the mean.
TEST(WeightedMeanTest, ABatchBeingAddedIsWaitedForByResetFinishAndTheDestructor) {
  const uint64_t update_bytes = RandomUpdate(DType::kF32, 1).total_bytes();
  const WeightedMeanOptions options{
      .accumulation = Accumulation::kExact, .num_threads = 2, .max_deferred_bytes = update_bytes};
  for (int round = 0; round < 20; ++round) {
    WeightedMean reused(RandomUpdate(DType::kF32, 1), options);
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(reused.AcceptOwned(RandomUpdate(DType::kF32, 20 + k), 1.0).ok());
    reused.Reset();  // the second AcceptOwned filled the batch: it may still be adding
    WeightedMean fresh(RandomUpdate(DType::kF32, 1), options);
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(reused.AcceptOwned(RandomUpdate(DType::kF32, 30 + k), 2.0 + k).ok());
      ASSERT_TRUE(fresh.Accept(RandomUpdate(DType::kF32, 30 + k), 2.0 + k).ok());
    }
    auto want = std::move(fresh).Finish();
    auto got = std::move(reused).Finish();  // right after the fourth filled a batch
    ASSERT_TRUE(want.ok() && got.ok());
    for (size_t t = 0; t < want->size(); ++t) {
      EXPECT_EQ(std::memcmp((*got)[t].data.data(), (*want)[t].data.data(), (*want)[t].data.size()), 0) << round;
    }
    WeightedMean dropped(RandomUpdate(DType::kF32, 1), options);
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(dropped.AcceptOwned(RandomUpdate(DType::kF32, 40 + k), 1.0).ok());
  }  // `dropped` goes while its batch may still be adding
}

// A reset mean starts over on its old sums' memory (or on new memory when a kFloat32 result still views it) and
// gives the same bits as a fresh one; an earlier result stays intact.
TEST(WeightedMeanTest, ResetStartsOverAndLeavesEarlierResultsAlone) {
  for (Accumulation accumulation : {Accumulation::kFloat32, Accumulation::kExact}) {
    WeightedMean reused(RandomUpdate(DType::kF32, 1), {.accumulation = accumulation, .num_threads = 2});
    ASSERT_TRUE(reused.Accept(RandomUpdate(DType::kF32, 3), 2.0).ok());
    auto first = std::move(reused).Finish();
    ASSERT_TRUE(first.ok());
    const std::vector<double> first_values = ReadAsDouble((*first)[0]);
    EXPECT_EQ(reused.Accept(RandomUpdate(DType::kF32, 4), 1.0).code(), StatusCode::kFailedPrecondition);

    reused.Reset();
    EXPECT_EQ(reused.num_accepted(), 0);
    WeightedMean fresh(RandomUpdate(DType::kF32, 1), {.accumulation = accumulation, .num_threads = 2});
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(reused.AcceptOwned(RandomUpdate(DType::kF32, 10 + k), 1.0 + k).ok());
      ASSERT_TRUE(fresh.Accept(RandomUpdate(DType::kF32, 10 + k), 1.0 + k).ok());
    }
    auto want = std::move(fresh).Finish();
    auto got = std::move(reused).Finish();
    ASSERT_TRUE(want.ok() && got.ok());
    for (size_t t = 0; t < want->size(); ++t) {
      EXPECT_EQ(std::memcmp((*got)[t].data.data(), (*want)[t].data.data(), (*want)[t].data.size()), 0)
          << "accumulation " << static_cast<int>(accumulation) << " tensor " << t;
    }
    EXPECT_EQ(ReadAsDouble((*first)[0]), first_values);
    EXPECT_TRUE(reused.CheckLayout(RandomUpdate(DType::kF32, 5)).ok());
    EXPECT_EQ(reused.CheckLayout(RandomUpdate(DType::kBF16, 5)).code(), StatusCode::kInvalidArgument);
  }
}

// A result's buffer that nobody holds any more is written again by a later round (its pages stay mapped), with a
// fresh mean's bits; one still held is never written over. kFloat32 results of F32 tensors are views of the sums:
// there a later round sums into the free buffer.
TEST(WeightedMeanTest, AResultNobodyHoldsIsWrittenAgainAndAHeldOneIsLeftAlone) {
  struct Case {
    DType dtype;
    Accumulation accumulation;
  };
  for (const Case& c : {Case{DType::kF32, Accumulation::kExact}, Case{DType::kBF16, Accumulation::kExact},
                        Case{DType::kF32, Accumulation::kFloat32}, Case{DType::kBF16, Accumulation::kFloat32}}) {
    SCOPED_TRACE("dtype " + std::string(DTypeName(c.dtype)) + ", accumulation " +
                 std::to_string(static_cast<int>(c.accumulation)));
    const DType dtype = c.dtype;
    const WeightedMeanOptions options{.accumulation = c.accumulation, .num_threads = 2};
    WeightedMean reused(RandomUpdate(dtype, 1), options);
    auto round = [&](WeightedMean& mean, uint32_t seed) {
      mean.Reset();
      for (uint32_t k = 0; k < 3; ++k) EXPECT_TRUE(mean.AcceptOwned(RandomUpdate(dtype, seed + k), 1.0 + k).ok());
      StatusOr<WeightSet> result = std::move(mean).Finish();
      EXPECT_TRUE(result.ok());
      return *std::move(result);
    };
    auto expect_fresh_bits = [&](const WeightSet& got, uint32_t seed) {
      WeightedMean fresh(RandomUpdate(dtype, 1), options);
      const WeightSet want = round(fresh, seed);
      for (size_t t = 0; t < want.size(); ++t) {
        EXPECT_EQ(std::memcmp(got[t].data.data(), want[t].data.data(), want[t].data.size()), 0) << "tensor " << t;
      }
    };
    std::optional<WeightSet> first = round(reused, 10);
    const std::byte* first_bytes = (*first)[0].data.data();
    const std::vector<double> first_values = ReadAsDouble((*first)[0]);
    const WeightSet second = round(reused, 20);
    EXPECT_NE(second[0].data.data(), first_bytes) << "the first result is still held";
    EXPECT_EQ(ReadAsDouble((*first)[0]), first_values);
    first.reset();
    const WeightSet third = round(reused, 30);
    EXPECT_EQ(third[0].data.data(), first_bytes) << "the first result's buffer, free again";
    expect_fresh_bits(second, 20);
    expect_fresh_bits(third, 30);
  }
}

// kExact's definition for element i of one-tensor f32 updates: each n * w (in double) rounded to nearest even on a
// 2^-64 grid, summed as integers, divided in long double.
float ExactMeanByDefinition(const std::vector<WeightSet>& updates, std::span<const double> counts, size_t i) {
  auto fixed = [](double x) { return static_cast<__int128>(std::nearbyintl(static_cast<long double>(x) * 0x1p64L)); };
  __int128 total = 0;
  __int128 sum = 0;
  for (size_t k = 0; k < updates.size(); ++k) {
    total += fixed(counts[k]);
    sum += fixed(counts[k] * static_cast<double>(updates[k][0].as<float>()[i]));
  }
  return static_cast<float>(static_cast<long double>(sum) / static_cast<long double>(total));
}

// kExact against its definition (ExactMeanByDefinition), bit for bit. Values span 2^-70..2^20 times sample counts
// of 1..10^6, so terms below, near and far above 2^63 on the grid (one int64 to several limbs) and exact ties on the
// grid are all covered.
TEST(WeightedMeanTest, ExactMatchesItsFixedPointDefinitionBitForBit) {
  std::mt19937_64 rng(21);
  std::vector<float> values;
  for (int e = -70; e <= 20; ++e) {
    for (int i = 0; i < 40; ++i) {
      const float mantissa = std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
      values.push_back(std::ldexp(i % 2 ? -mantissa : mantissa, e));
    }
  }
  values.push_back(0x1p-65f);    // 0.5 on the grid with n = 1: a tie, rounded to even (0)
  values.push_back(0x1.8p-64f);  // 1.5 on the grid: a tie, rounded to even (2)
  const std::vector<Spec> specs = {{"w", {static_cast<int64_t>(values.size())}}};
  const double counts[] = {1, 3, 977, 1e6};
  std::vector<WeightSet> updates;
  for (size_t k = 0; k < std::size(counts); ++k) {
    WeightSet set;
    auto bytes = set.AddZeros("w", DType::kF32, specs[0].shape);
    ASSERT_TRUE(bytes.ok());
    std::vector<float> shuffled = values;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::memcpy(bytes->data(), shuffled.data(), shuffled.size() * 4);
    updates.push_back(std::move(set));
  }
  WeightedMean mean(updates[0], {.accumulation = Accumulation::kExact, .num_threads = 1});
  for (size_t k = 0; k < updates.size(); ++k) ASSERT_TRUE(mean.Accept(updates[k], counts[k]).ok());
  auto result = std::move(mean).Finish();
  ASSERT_TRUE(result.ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = ExactMeanByDefinition(updates, counts, i);
    ASSERT_EQ(std::bit_cast<uint32_t>((*result)[0].as<float>()[i]), std::bit_cast<uint32_t>(want)) << "element " << i;
  }
}

// kExact's quotient near the midpoint between two floats, where a double quotient (53 bits) cannot tell which way
// the 80-bit one rounds: weights 1, 1 and 2^-30 put element i at 1 + 2^-24 (a float midpoint) plus or minus about
// 2^-55 times a small integer, and at the same far from any midpoint, and negated; all must match the definition.
TEST(WeightedMeanTest, ExactRoundsQuotientsNearAFloatMidpointAsItsDefinition) {
  const float one = 1.0f, above = std::nextafter(1.0f, 2.0f), below = std::nextafter(1.0f, 0.0f);
  const float third[] = {one, above, std::nextafter(above, 2.0f), below, 1.5f, 0.75f, 3.0f, 0.0f};
  const size_t size = 64;  // several 8-element vectors
  std::vector<float> w1(size), w2(size), w3(size);
  for (size_t i = 0; i < size; ++i) {
    const float sign = i >= size / 2 ? -1.0f : 1.0f;
    w1[i] = sign * one;
    w2[i] = sign * above;
    w3[i] = sign * third[i % std::size(third)];
  }
  const double counts[] = {1, 1, 0x1p-30};
  std::vector<WeightSet> updates;
  for (const std::vector<float>* values : {&w1, &w2, &w3}) {
    WeightSet set;
    auto bytes = set.AddZeros("w", DType::kF32, {static_cast<int64_t>(size)});
    ASSERT_TRUE(bytes.ok());
    std::memcpy(bytes->data(), values->data(), size * 4);
    updates.push_back(std::move(set));
  }
  WeightedMean mean(updates[0], {.accumulation = Accumulation::kExact, .num_threads = 1});
  for (size_t k = 0; k < updates.size(); ++k) ASSERT_TRUE(mean.Accept(updates[k], counts[k]).ok());
  auto result = std::move(mean).Finish();
  ASSERT_TRUE(result.ok());
  int rounded_up = 0;
  for (size_t i = 0; i < size; ++i) {
    const float want = ExactMeanByDefinition(updates, counts, i);
    rounded_up += std::fabs(want) == above;
    ASSERT_EQ(std::bit_cast<uint32_t>((*result)[0].as<float>()[i]), std::bit_cast<uint32_t>(want)) << "element " << i;
  }
  EXPECT_GT(rounded_up, 0);  // the cases are really on both sides of the midpoint
}

// Builds a one-tensor-per-spec set in `dtype` filled with `value`.
WeightSet Filled(DType dtype, float value, const std::vector<Spec>& specs) {
  WeightSet set;
  for (const Spec& spec : specs) {
    auto bytes = set.AddZeros(spec.name, dtype, spec.shape);
    EXPECT_TRUE(bytes.ok());
    Store(*bytes, dtype, std::vector<float>(bytes->size() / DTypeSize(dtype), value));
  }
  return set;
}

TEST(WeightedMeanTest, RejectsLayoutMismatchesAndAddsNothing) {
  const std::vector<Spec> specs = {{"a", {4, 8}}, {"b", {3}}};
  WeightedMean mean(Filled(DType::kF32, 0, specs));
  ASSERT_TRUE(mean.Accept(Filled(DType::kF32, 2.0f, specs), 1).ok());
  struct Row {
    WeightSet update;
    std::string message;
  };
  std::vector<Row> rows;
  rows.push_back({Filled(DType::kF32, 9, {{"a", {4, 8}}, {"c", {3}}}), "unexpected tensor 'c'"});
  rows.push_back({Filled(DType::kBF16, 9, specs), "tensor 'a' has dtype BF16, expected F32"});
  rows.push_back({Filled(DType::kF32, 9, {{"a", {8, 4}}, {"b", {3}}}), "tensor 'a' has shape [8, 4], expected [4, 8]"});
  rows.push_back({Filled(DType::kF32, 9, {{"a", {4, 8}}, {"b", {1, 3}}}), "tensor 'b' has shape [1, 3], expected [3]"});
  rows.push_back({Filled(DType::kF32, 9, {{"a", {4, 8}}}), "missing tensor 'b'"});
  for (const Row& row : rows) {
    Status s = mean.Accept(row.update, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(row.message), std::string::npos) << s.message();
  }
  EXPECT_EQ(mean.num_accepted(), 1);
  EXPECT_EQ(mean.total_weight(), 1);
  auto result = std::move(mean).Finish();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ((*result)[0].as<float>()[0], 2.0f);
}

TEST(WeightedMeanTest, RejectsNonFiniteValuesBeforeAddingAnything) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Accumulation mode : {Accumulation::kFloat32, Accumulation::kExact}) {
      WeightedMean mean(RandomUpdate(dtype, 1), {.accumulation = mode, .num_threads = 2});
      WeightedMean clean(RandomUpdate(dtype, 1), {.accumulation = mode, .num_threads = 2});
      WeightSet good = RandomUpdate(dtype, 2);
      ASSERT_TRUE(mean.Accept(good, 2).ok());
      ASSERT_TRUE(clean.Accept(good, 2).ok());
      for (float bad : {kNan, kInf, -kInf}) {
        WeightSet update = RandomUpdate(dtype, 3);
        // Poison the last element of the second tensor: a check done while adding would already have added the
        // first tensor.
        const Tensor& target = update[1];
        const size_t index = static_cast<size_t>(target.numel()) - 1;
        Store(target.data.subspan(index * DTypeSize(dtype)), dtype, {bad});
        Status s = mean.Accept(update, 1);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(s.message().find("tensor 'q.lora_A.weight' has a non-finite value"), std::string::npos)
            << s.message();
        EXPECT_NE(s.message().find("at index " + std::to_string(index)), std::string::npos) << s.message();
      }
      EXPECT_EQ(mean.num_accepted(), 1);
      auto got = std::move(mean).Finish();
      auto want = std::move(clean).Finish();
      ASSERT_TRUE(got.ok() && want.ok());
      for (size_t t = 0; t < got->size(); ++t) {
        EXPECT_EQ(std::memcmp((*got)[t].data.data(), (*want)[t].data.data(), (*got)[t].data.size()), 0);
      }
    }
  }
}

TEST(WeightedMeanTest, AggregatesMemoryMappedUpdatesLikeInMemoryOnes) {
  // The coordinator's path: updates arrive as safetensors files and are averaged straight from the mapping.
  const test_support::TempDir temp("parsyn-wm-test");  // removed also when an assertion returns early
  const std::filesystem::path& dir = temp.path();
  WeightedMean from_files(RandomUpdate(DType::kBF16, 1));
  WeightedMean in_memory(RandomUpdate(DType::kBF16, 1));
  for (uint32_t k = 0; k < 3; ++k) {
    WeightSet update = RandomUpdate(DType::kBF16, 20 + k);
    const auto path = dir / ("update_" + std::to_string(k) + ".safetensors");
    ASSERT_TRUE(WriteSafetensorsFile(update, path).ok());
    auto mapped = ReadSafetensorsFile(path);
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    // The reader returns tensors in data order, which is the order they were written in.
    ASSERT_TRUE(from_files.Accept(*mapped, 10.0 + k).ok());
    ASSERT_TRUE(in_memory.Accept(update, 10.0 + k).ok());
  }
  auto a = std::move(from_files).Finish();
  auto b = std::move(in_memory).Finish();
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t t = 0; t < a->size(); ++t) {
    ASSERT_EQ((*a)[t].data.size(), (*b)[t].data.size());
    EXPECT_EQ(std::memcmp((*a)[t].data.data(), (*b)[t].data.data(), (*a)[t].data.size()), 0) << (*a)[t].name;
  }
}

// The coordinator's path for an update whose values were checked as it was uploaded: read-only mapped, with the
// magnitude the stream check found. The bits are those of AcceptOwned finding the bound itself, and the verdict is
// taken on the given bound (here one the values alone would pass).
TEST(WeightedMeanTest, AcceptOwnedWithAKnownMagnitudeGivesTheSameBitsAndJudgesByIt) {
  const test_support::TempDir temp("parsyn-wm-test");
  const uint64_t update_bytes = RandomUpdate(DType::kF32, 1).total_bytes();
  const WeightedMeanOptions options{
      .accumulation = Accumulation::kExact, .num_threads = 2, .max_deferred_bytes = update_bytes * 5 / 2};
  WeightedMean scanned(RandomUpdate(DType::kF32, 1), options);
  WeightedMean told(RandomUpdate(DType::kF32, 1), options);
  for (uint32_t k = 0; k < 7; ++k) {
    const auto path = temp.path() / ("update_" + std::to_string(k) + ".safetensors");
    ASSERT_TRUE(WriteSafetensorsFile(RandomUpdate(DType::kF32, 40 + k), path).ok());
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SafetensorsStreamChecker checker;
    checker.Update(std::as_bytes(std::span<const char>(bytes)));
    ASSERT_TRUE(checker.Finish().ok());
    auto for_scanned = MapSafetensorsFileReadOnly(path);
    auto for_told = MapSafetensorsFileReadOnly(path);
    ASSERT_TRUE(for_scanned.ok() && for_told.ok());
    // 2.5 updates fit the kept bytes: every third AcceptOwned fills the batch, and starts adding it on its own thread
    // (at once unless the batch before is still being added); the others only keep.
    if (k % 3 != 2) {
      EXPECT_TRUE(told.AcceptOwnedIsQuick(*for_told)) << k;
    }
    ASSERT_TRUE(scanned.AcceptOwned(std::move(*for_scanned), 3.0 + k).ok());
    ASSERT_TRUE(told.AcceptOwned(std::move(*for_told), 3.0 + k, checker.max_magnitude()).ok());
  }
  auto want = std::move(scanned).Finish();
  auto got = std::move(told).Finish();
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t t = 0; t < want->size(); ++t) {
    ASSERT_EQ((*got)[t].data.size(), (*want)[t].data.size());
    EXPECT_EQ(std::memcmp((*got)[t].data.data(), (*want)[t].data.data(), (*want)[t].data.size()), 0) << t;
  }

  const std::vector<Spec> specs = {{"w", {4}}};
  WeightedMean exact(Filled(DType::kF32, 0, specs), {.accumulation = Accumulation::kExact});
  Status s = exact.AcceptOwned(Filled(DType::kF32, 1.0f, specs), 1, /*max_magnitude=*/1e20);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("too large for exact accumulation"), std::string::npos) << s.message();
  EXPECT_EQ(exact.num_accepted(), 0);
  EXPECT_TRUE(exact.AcceptOwned(Filled(DType::kF32, 1.0f, specs), 1, /*max_magnitude=*/1.0).ok());
}

// Large sums are not kept: read-only mapped updates wait on disk and Finish sums them chunk by chunk. The bits must be
// those of the streaming sums: for kExact whatever the arrival order (10 orders), and after a restart that reads the
// stored updates again; for the float accumulations in the same order.
TEST(WeightedMeanTest, WaitingOnDiskGivesTheStreamingBitsInAnyOrderAndAfterARestart) {
  const test_support::TempDir temp("parsyn-wm-disk");  // removed also when an assertion returns early
  const std::filesystem::path& dir = temp.path();
  constexpr int K = 6;
  const double weights[K] = {0.1, 1234.5678, 3e-3, 77.7, 0.3, 1e5 / 3};
  auto bytes_of = [](const WeightSet& set) {
    std::vector<std::byte> bytes;
    for (const Tensor& t : set.tensors()) bytes.insert(bytes.end(), t.data.begin(), t.data.end());
    return bytes;
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<std::filesystem::path> paths;
    WeightedMean streaming(RandomUpdate(dtype, 1), {.accumulation = Accumulation::kExact, .num_threads = 2});
    WeightedMean streaming_f32(RandomUpdate(dtype, 1), {.accumulation = Accumulation::kFloat32, .num_threads = 2});
    for (int k = 0; k < K; ++k) {
      WeightSet update = RandomUpdate(dtype, 40 + k);
      paths.push_back(dir / ("update_" + std::to_string(k) + ".safetensors"));
      ASSERT_TRUE(WriteSafetensorsFile(update, paths.back()).ok());
      ASSERT_TRUE(streaming.Accept(update, weights[k]).ok());
      ASSERT_TRUE(streaming_f32.Accept(update, weights[k]).ok());
    }
    EXPECT_FALSE(streaming.waiting_on_disk());
    auto want = std::move(streaming).Finish();
    auto want_f32 = std::move(streaming_f32).Finish();
    ASSERT_TRUE(want.ok() && want_f32.ok());
    const WeightedMeanOptions on_disk{
        .accumulation = Accumulation::kExact, .num_threads = 2, .max_whole_sums_bytes = 0};

    // A coordinator that took half the round's updates and restarted: the new one reads the stored files again.
    {
      WeightedMean before_restart(RandomUpdate(dtype, 1), on_disk);
      for (int k = 0; k < K / 2; ++k) {
        auto update = MapSafetensorsFileReadOnly(paths[k]);
        ASSERT_TRUE(update.ok()) << update.status().ToString();
        ASSERT_TRUE(before_restart.AcceptOwned(std::move(*update), weights[k]).ok());
      }
    }  // gone with the process; nothing of it was summed

    std::vector<int> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(5);
    for (int trial = 0; trial < 10; ++trial) {
      std::shuffle(order.begin(), order.end(), rng);
      WeightedMean mean(RandomUpdate(dtype, 1), on_disk);
      for (int k : order) {
        auto update = MapSafetensorsFileReadOnly(paths[k]);
        ASSERT_TRUE(update.ok()) << update.status().ToString();
        EXPECT_EQ(update->pinned_bytes(), 0u);
        ASSERT_TRUE(mean.AcceptOwned(std::move(*update), weights[k]).ok());
        mean.AddKept();  // the coordinator calls it when idle: it must not allocate the sums
        EXPECT_TRUE(mean.waiting_on_disk()) << "trial " << trial;
      }
      auto got = std::move(mean).Finish();
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(bytes_of(*got), bytes_of(*want)) << DTypeName(dtype) << " order #" << trial;
    }

    // An update that cannot wait on disk (in memory, borrowed) brings the sums back; the bits stay the same.
    {
      WeightedMean mean(RandomUpdate(dtype, 1), on_disk);
      for (int k = K - 1; k >= 0; --k) {
        auto update = MapSafetensorsFileReadOnly(paths[k]);
        ASSERT_TRUE(update.ok());
        ASSERT_TRUE(
            (k == 2 ? mean.Accept(*update, weights[k]) : mean.AcceptOwned(std::move(*update), weights[k])).ok());
        EXPECT_EQ(mean.waiting_on_disk(), k > 2);
      }
      auto got = std::move(mean).Finish();
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(bytes_of(*got), bytes_of(*want)) << DTypeName(dtype) << " with sums brought back";
    }

    // fp32 sums chunk by chunk: the streaming bits in the same order.
    {
      WeightedMean mean(RandomUpdate(dtype, 1),
                        {.accumulation = Accumulation::kFloat32, .num_threads = 2, .max_whole_sums_bytes = 0});
      for (int k = 0; k < K; ++k) {
        auto update = MapSafetensorsFileReadOnly(paths[k]);
        ASSERT_TRUE(update.ok());
        ASSERT_TRUE(mean.AcceptOwned(std::move(*update), weights[k]).ok());
      }
      auto got = std::move(mean).Finish();
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(bytes_of(*got), bytes_of(*want_f32)) << DTypeName(dtype) << " fp32 sums";
    }
  }
}

// A mean waiting on disk that is reset and reused (the next round) waits on disk again.
TEST(WeightedMeanTest, ResetOfAMeanOverLargeSumsWaitsOnDiskAgain) {
  WeightedMean mean(RandomUpdate(DType::kF32, 1), {.accumulation = Accumulation::kExact, .max_whole_sums_bytes = 0});
  ASSERT_TRUE(mean.Accept(RandomUpdate(DType::kF32, 2), 1.0).ok());  // borrowed: the sums are allocated
  EXPECT_FALSE(mean.waiting_on_disk());
  ASSERT_TRUE(std::move(mean).Finish().ok());
  mean.Reset();
  EXPECT_TRUE(mean.waiting_on_disk());
}

TEST(WeightedMeanTest, AcceptAfterFinishIsFailedPrecondition) {
  const std::vector<Spec> specs = {{"w", {4}}};
  WeightedMean mean(Filled(DType::kF32, 0, specs));
  ASSERT_TRUE(mean.Accept(Filled(DType::kF32, 1, specs), 1).ok());
  auto result = std::move(mean).Finish();
  ASSERT_TRUE(result.ok());
  Status s = mean.Accept(Filled(DType::kF32, 5, specs), 1);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*result)[0].as<float>()[0], 1.0f);
}

TEST(WeightedMeanTest, RejectsBadWeights) {
  const std::vector<Spec> specs = {{"w", {4}}};
  WeightedMean mean(Filled(DType::kF32, 0, specs));
  WeightSet update = Filled(DType::kF32, 1, specs);
  for (double n : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Status s = mean.Accept(update, n);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(s.message().find("must be finite and > 0"), std::string::npos) << s.message();
  }
  EXPECT_EQ(mean.num_accepted(), 0);
}

TEST(WeightedMeanTest, FinishWithNothingAcceptedIsFailedPrecondition) {
  WeightedMean mean(Filled(DType::kBF16, 0, {{"w", {4}}}));
  auto result = std::move(mean).Finish();
  EXPECT_EQ(result.status().code(), StatusCode::kFailedPrecondition);
}

TEST(WeightedMeanTest, RejectsNonFloatTensorsAndOverflowingUpdates) {
  WeightSet ints;
  ASSERT_TRUE(ints.AddZeros("step", DType::kI64, {1}).ok());
  WeightedMean int_mean(ints);
  Status s = int_mean.Accept(ints, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tensor 'step' has dtype I64; only F32, BF16 and F16 tensors can be averaged");

  const std::vector<Spec> specs = {{"w", {4}}};
  WeightedMean fp32(Filled(DType::kF32, 0, specs));
  ASSERT_TRUE(fp32.Accept(Filled(DType::kF32, 3e38f, specs), 1).ok());
  s = fp32.Accept(Filled(DType::kF32, 3e38f, specs), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("could overflow the accumulator"), std::string::npos) << s.message();
  // The same sums fit an fp64 accumulator.
  WeightedMean fp64(Filled(DType::kF32, 0, specs), {.accumulation = Accumulation::kFloat64});
  ASSERT_TRUE(fp64.Accept(Filled(DType::kF32, 3e38f, specs), 1).ok());
  ASSERT_TRUE(fp64.Accept(Filled(DType::kF32, 3e38f, specs), 1).ok());
  EXPECT_EQ((*std::move(fp64).Finish())[0].as<float>()[0], 3e38f);

  WeightedMean exact(Filled(DType::kF32, 0, specs), {.accumulation = Accumulation::kExact});
  s = exact.Accept(Filled(DType::kF32, 1e20f, specs), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("too large for exact accumulation"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace parsyn::weights
