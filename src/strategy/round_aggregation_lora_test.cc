// RoundAggregation with LoRA updates of mixed ranks (round_aggregation.h, LoraRanks): zero-padding, the exact
// factored mean, and what each keeps of the global's ranks a worker did not train.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "strategy/fed_avg.h"
#include "strategy/robust_aggregation.h"
#include "strategy/round_aggregation.h"
#include "weights/lora_rank.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::WeightSet;

constexpr int64_t kOut = 6, kIn = 5;

// One module "m": lora_A (r, 5) and lora_B (6, r), values in [-1, 1).
WeightSet Adapter(int64_t r, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(static_cast<size_t>(r * kIn)), b(static_cast<size_t>(kOut * r));
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  WeightSet set;
  EXPECT_TRUE(set.Add("m.lora_A.weight", DType::kF32, {r, kIn}, std::as_bytes(std::span(a))).ok());
  EXPECT_TRUE(set.Add("m.lora_B.weight", DType::kF32, {kOut, r}, std::as_bytes(std::span(b))).ok());
  return set;
}

// B·A of the module, row-major (6 x 5), in double.
std::vector<double> Product(const WeightSet& set) {
  auto a = set.Find("m.lora_A.weight")->as<float>();
  auto b = set.Find("m.lora_B.weight")->as<float>();
  const int64_t r = set.Find("m.lora_A.weight")->shape[0];
  std::vector<double> p(kOut * kIn, 0.0);
  for (int64_t o = 0; o < kOut; ++o) {
    for (int64_t i = 0; i < kIn; ++i) {
      for (int64_t l = 0; l < r; ++l) p[o * kIn + i] += double(b[o * r + l]) * a[l * kIn + i];
    }
  }
  return p;
}

double MaxDiff(const std::vector<double>& x, const std::vector<double>& y) {
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

// Every worker sends back what it started from (no training): the factored mean keeps the global, the ranks the
// lower-rank workers never had included. Zero-padding shrinks those ranks by the lower-rank workers' weight.
TEST(RoundAggregationLoraTest, AnUntrainedRoundKeepsTheGlobalWithSvdAndShrinksItWithZeros) {
  const WeightSet global = Adapter(4, 1);
  for (LoraRanks mode : {LoraRanks::kFactored, LoraRanks::kZeroPadded}) {
    FedAvg fed_avg;
    RoundAggregation round(fed_avg, mode);
    ASSERT_TRUE(round.Begin(1, global).ok());
    const bool svd = mode == LoraRanks::kFactored;
    // What a rank-1 worker starts from: the global's top rank, its product scaled by 1 / 4 (PEFT's alpha / r).
    WeightSet top = svd ? *weights::TruncateLoraRank(global, 1) : *weights::SliceLoraRank(global, 1);
    WeightSet low = *weights::ScaleLoraProducts(top, 0.25);
    ASSERT_TRUE(round.Accept(low, 10).ok());
    ASSERT_TRUE(round.Accept(global, 10).ok());
    StatusOr<WeightSet> next = round.Finish();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->Find("m.lora_A.weight")->shape, (std::vector<int64_t>{4, kIn}));
    const double diff = MaxDiff(Product(*next), Product(global));
    if (svd) {
      EXPECT_LT(diff, 1e-5) << "the global changed although nobody trained";
    } else {
      EXPECT_GT(diff, 0.05) << "zero-padding is expected to shrink the ranks the rank-1 worker lacked";
    }
  }
}

// Whether `g` (rank <= its rank) is the best low-rank approximation of `m` as far as the first-order conditions go:
// the residual m - g is orthogonal to g's column and row spaces (g^T (m - g) = 0 and (m - g) g^T = 0), to `tolerance`
// of |g| |m|. A product other than the truncated SVD of m (the mean of other products, or m itself untruncated when
// it has a higher rank) fails it.
void ExpectBestApproximation(const std::vector<double>& g, const std::vector<double>& m, double tolerance) {
  double scale = 0;
  for (size_t i = 0; i < g.size(); ++i) scale = std::max(scale, std::abs(g[i]) * std::abs(m[i]) + std::abs(m[i]));
  for (int64_t x = 0; x < kIn; ++x) {
    for (int64_t y = 0; y < kIn; ++y) {
      double gr = 0;  // (g^T r)[x][y]
      for (int64_t o = 0; o < kOut; ++o) gr += g[o * kIn + x] * (m[o * kIn + y] - g[o * kIn + y]);
      EXPECT_NEAR(gr, 0, tolerance * scale * kOut) << x << " " << y;
    }
  }
  for (int64_t x = 0; x < kOut; ++x) {
    for (int64_t y = 0; y < kOut; ++y) {
      double rg = 0;  // (r g^T)[x][y]
      for (int64_t i = 0; i < kIn; ++i) rg += (m[x * kIn + i] - g[x * kIn + i]) * g[y * kIn + i];
      EXPECT_NEAR(rg, 0, tolerance * scale * kIn) << x << " " << y;
    }
  }
}

// The factored mean of updates of ranks 1 and 3 under a rank-4 global: each lower-rank update, scaled by 4 / r into the
// global's units, is completed with the global's ranks beyond its own (from the global's SVD), and the result is the
// best rank-4 approximation of the weighted mean of those completed products; the same bytes whatever the order the
// updates arrive in.
TEST(RoundAggregationLoraTest, TheFactoredMeanTruncatesTheMeanOfTheCompletedProductsWhateverTheOrder) {
  const WeightSet global = Adapter(4, 2);
  const WeightSet svd_global = *weights::TruncateLoraRank(global, 4);
  const WeightSet one = Adapter(1, 3), three = Adapter(3, 4);
  std::vector<double> mean(kOut * kIn, 0.0);
  for (const auto& [update, n] : {std::pair{&one, 30.0}, std::pair{&three, 10.0}}) {
    const int64_t rank = update->Find("m.lora_A.weight")->shape[0];
    const WeightSet scaled = *weights::ScaleLoraProducts(*update, 4.0 / static_cast<double>(rank));
    const std::vector<double> p = Product(*weights::ExtendLoraRank(scaled, svd_global));
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += n / 40.0 * p[i];
  }
  std::vector<WeightSet> results;
  for (bool one_first : {true, false}) {
    FedAvg fed_avg;
    RoundAggregation round(fed_avg, LoraRanks::kFactored);
    ASSERT_TRUE(round.Begin(1, global).ok());
    if (one_first) {
      ASSERT_TRUE(round.Accept(one, 30).ok());
    }
    ASSERT_TRUE(round.Accept(three, 10).ok());
    if (!one_first) {
      ASSERT_TRUE(round.Accept(one, 30).ok());
    }
    EXPECT_EQ(round.num_accepted(), 2);
    StatusOr<WeightSet> next = round.Finish();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    results.push_back(std::move(*next));
  }
  for (size_t t = 0; t < 2; ++t) {
    const auto x = results[0].tensors()[t].data, y = results[1].tensors()[t].data;
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << "tensor " << t << " depends on the arrival order";
  }
  ExpectBestApproximation(Product(results[0]), mean, 1e-5);
  EXPECT_GT(MaxDiff(Product(results[0]), mean), 1e-3) << "the mean has rank > 4 here: it must have been truncated";
}

TEST(RoundAggregationLoraTest, ZeroPaddedUpdatesAverageAsPaddedFactors) {
  const WeightSet global = Adapter(3, 5);
  const WeightSet low = Adapter(1, 6), full = Adapter(3, 7);
  FedAvg fed_avg;
  RoundAggregation round(fed_avg, LoraRanks::kZeroPadded);
  ASSERT_TRUE(round.Begin(1, global).ok());
  ASSERT_TRUE(round.Accept(low, 1).ok());
  ASSERT_TRUE(round.Accept(full, 3).ok());
  StatusOr<WeightSet> next = round.Finish();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  const WeightSet padded = *weights::ZeroPadLoraRank(*weights::ScaleLoraProducts(low, 3.0), 3);
  for (size_t t = 0; t < 2; ++t) {
    auto got = next->tensors()[t].as<float>();
    auto p = padded.tensors()[t].as<float>(), f = full.tensors()[t].as<float>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], (p[i] + 3 * f[i]) / 4, 1e-6) << t << " " << i;
  }
}

TEST(RoundAggregationLoraTest, RefusesRanksAboveTheGlobalsAndStrategiesThatDoNotAverage) {
  FedAvg fed_avg;
  RoundAggregation round(fed_avg, LoraRanks::kFactored);
  ASSERT_TRUE(round.Begin(1, Adapter(2, 8)).ok());
  Status refused = round.Accept(Adapter(3, 9), 5);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("rank 3, above"), std::string::npos) << refused.message();
  EXPECT_EQ(round.num_accepted(), 0);

  Median median;
  RoundAggregation robust(median, LoraRanks::kFactored);
  Status begun = robust.Begin(1, Adapter(2, 8));
  EXPECT_EQ(begun.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(begun.message().find("use zero-padding"), std::string::npos) << begun.message();
}

}  // namespace
}  // namespace parsyn::strategy
