#include "strategy/robust_aggregation.h"
#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "strategy/aggregating_strategy_for_test.h"
#include "strategy/fed_avg.h"
#include "weights/safetensors.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::Tensor;
using weights::WeightSet;

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Odd shapes, all three dtypes, and tensors longer than one chunk (kChunkElements = 16384) so chunk edges are
// crossed. Names in alphabetical order (a safetensors header is a JSON object).
const std::vector<Entry>& TestLayout() {
  static const std::vector<Entry> layout = {
      {"a", DType::kF32, {3, 5}}, {"b", DType::kBF16, {7}},       {"c", DType::kF16, {2, 3, 1}},
      {"d", DType::kF32, {1}},    {"e", DType::kF32, {130, 257}}, {"g", DType::kBF16, {17000}},
  };
  return layout;
}

// A set with TestLayout's tensors, element j of tensor t = value(t, j) in the tensor's dtype.
WeightSet MakeLayoutSet(const std::vector<Entry>& layout, const std::function<float(size_t, size_t)>& value) {
  WeightSet set;
  for (size_t t = 0; t < layout.size(); ++t) {
    const Entry& e = layout[t];
    StatusOr<std::span<std::byte>> out = set.AddZeros(e.name, e.dtype, e.shape);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    const size_t numel = out->size() / weights::DTypeSize(e.dtype);
    for (size_t j = 0; j < numel; ++j) {
      const float v = value(t, j);
      if (e.dtype == DType::kF32) reinterpret_cast<float*>(out->data())[j] = v;
      if (e.dtype == DType::kBF16) reinterpret_cast<uint16_t*>(out->data())[j] = weights::FloatToBf16(v);
      if (e.dtype == DType::kF16) reinterpret_cast<uint16_t*>(out->data())[j] = weights::FloatToF16(v);
    }
  }
  return set;
}

WeightSet Zeros(const std::vector<Entry>& layout = TestLayout()) {
  return MakeLayoutSet(layout, [](size_t, size_t) { return 0.0f; });
}

WeightSet RandomLayoutSet(std::mt19937& rng, float offset = 0.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  return MakeLayoutSet(TestLayout(), [&](size_t, size_t) { return offset + normal(rng); });
}

float ValueAt(const Tensor& t, size_t j) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[j];
    case DType::kBF16: return weights::Bf16ToFloat(t.as<uint16_t>()[j]);
    case DType::kF16: return weights::F16ToFloat(t.as<uint16_t>()[j]);
    default: return NAN;
  }
}

std::vector<double> FlatDoubles(const WeightSet& set) {
  std::vector<double> out;
  for (const Tensor& t : set.tensors()) {
    for (size_t j = 0; j < static_cast<size_t>(t.numel()); ++j) out.push_back(ValueAt(t, j));
  }
  return out;
}

// Distance in units in the last place of the tensor's dtype (sign-magnitude bits mapped onto a line).
int64_t UlpDistance(const Tensor& a, const Tensor& b, size_t j) {
  auto ordered = [](uint64_t bits, int width) {
    const uint64_t sign = uint64_t{1} << (width - 1);
    return (bits & sign) ? -static_cast<int64_t>(bits & (sign - 1)) : static_cast<int64_t>(bits);
  };
  if (a.dtype == DType::kF32) {
    uint32_t x, y;
    std::memcpy(&x, a.data.data() + 4 * j, 4);
    std::memcpy(&y, b.data.data() + 4 * j, 4);
    return std::llabs(ordered(x, 32) - ordered(y, 32));
  }
  return std::llabs(ordered(a.as<uint16_t>()[j], 16) - ordered(b.as<uint16_t>()[j], 16));
}

bool SameBytes(const WeightSet& a, const WeightSet& b) {
  if (!a.CheckSameLayout(b).ok()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (std::memcmp(a[t].data.data(), b[t].data.data(), a[t].data.size()) != 0) return false;
  }
  return true;
}

struct RobustCase {
  std::string strategy;
  double beta = 0.0;
  int f = 0;
  int m = 0;
};

std::shared_ptr<RoundAggregation> Make(const RobustCase& c) {
  if (c.strategy == "median") return std::make_shared<AggregatingStrategy<Median>>();
  if (c.strategy == "trimmed_mean") {
    return std::make_shared<AggregatingStrategy<TrimmedMean>>(TrimmedMeanOptions{.beta = c.beta});
  }
  if (c.strategy == "krum") return std::make_shared<AggregatingStrategy<Krum>>(KrumOptions{.f = c.f});
  return std::make_shared<AggregatingStrategy<MultiKrum>>(MultiKrumOptions{.f = c.f, .m = c.m});
}

std::string Describe(const RobustCase& c, int k) {
  return c.strategy + " K=" + std::to_string(k) + " beta=" + std::to_string(c.beta) + " f=" + std::to_string(c.f) +
         " m=" + std::to_string(c.m);
}

TEST(RobustAggregationTest, MatchesNumpyReference) {
  test_support::TempDir dir("robust");
  std::mt19937 rng(14);
  std::uniform_int_distribution<int64_t> samples(1, 1000);
  nlohmann::json cases = nlohmann::json::array();
  struct Run {
    RobustCase c;
    int k;
    std::vector<std::string> updates;
    std::string out;
  };
  std::vector<Run> runs;
  for (int k = 1; k <= 9; ++k) {
    std::vector<std::string> paths;
    for (int i = 0; i < k; ++i) {
      std::string name = "k";  // appended, not concatenated: GCC 12 warns falsely (-Wrestrict) on the short `+` chain
      name.append(std::to_string(k)).append("_u").append(std::to_string(i)).append(".safetensors");
      paths.push_back((dir.path() / name).string());
      const std::vector<std::byte> image = weights::SerializeSafetensors(RandomLayoutSet(rng, 0.1f * i));
      std::ofstream(paths.back(), std::ios::binary).write(reinterpret_cast<const char*>(image.data()), image.size());
    }
    std::vector<RobustCase> list = {{"median"}, {"trimmed_mean", 0.1}, {"trimmed_mean", 0.25}, {"trimmed_mean", 0.4}};
    if (k >= 3) {
      const int f = (k - 3) / 2;  // the largest f that k updates allow
      list.push_back({"krum", 0, 0});
      if (f > 0) list.push_back({"krum", 0, f});
      list.push_back({"multi_krum", 0, f, 0});
      list.push_back({"multi_krum", 0, 0, 2});
    }
    for (const RobustCase& c : list) {
      runs.push_back({c, k, paths, (dir.path() / ("ref" + std::to_string(runs.size()) + ".safetensors")).string()});
      cases.push_back({{"updates", paths},
                       {"strategy", c.strategy},
                       {"beta", c.beta},
                       {"f", c.f},
                       {"m", c.m},
                       {"out", runs.back().out}});
    }
  }
  std::ofstream(dir.path() / "cases.json") << cases.dump();
  const std::filesystem::path script =
      std::filesystem::path(test_support::SourcePath("tests/reference/robust_aggregation.py"));
  const std::string command = "/usr/bin/python3 " + script.string() + " " + (dir.path() / "cases.json").string() +
                              " > " + (dir.path() / "python.log").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0)
      << command << "\n"
      << (std::stringstream() << std::ifstream(dir.path() / "python.log").rdbuf()).str();

  for (const Run& run : runs) {
    SCOPED_TRACE(Describe(run.c, run.k));
    std::shared_ptr<RoundAggregation> strategy = Make(run.c);
    ASSERT_TRUE(strategy->Begin(1, Zeros()).ok());
    for (const std::string& path : run.updates) {
      StatusOr<WeightSet> update = weights::ReadSafetensorsFile(path);  // memory-mapped, kept as is
      ASSERT_TRUE(update.ok()) << update.status().ToString();
      ASSERT_TRUE(strategy->AcceptOwned(std::move(*update), samples(rng), std::nullopt).ok());
    }
    StatusOr<WeightSet> ours = strategy->Finish();
    ASSERT_TRUE(ours.ok()) << ours.status().ToString();
    StatusOr<WeightSet> reference = weights::ReadSafetensorsFile(run.out);
    ASSERT_TRUE(reference.ok()) << reference.status().ToString();
    ASSERT_TRUE(ours->CheckSameLayout(*reference).ok());
    if (run.c.strategy == "median" || run.c.strategy == "krum") {
      EXPECT_TRUE(SameBytes(*ours, *reference));
      continue;
    }
    // Means: float64 sums in another order may round differently at a tie, never by more than one unit in the
    // last place of the output dtype.
    int64_t worst = 0;
    for (size_t t = 0; t < ours->size(); ++t) {
      for (size_t j = 0; j < static_cast<size_t>((*ours)[t].numel()); ++j) {
        worst = std::max(worst, UlpDistance((*ours)[t], (*reference)[t], j));
      }
    }
    EXPECT_LE(worst, 1);
  }
}

TEST(RobustAggregationTest, SmallTablesByHand) {
  const std::vector<Entry> layout = {{"w", DType::kF32, {4}}};
  auto set = [&](std::vector<float> v) { return MakeLayoutSet(layout, [v](size_t, size_t j) { return v[j]; }); };
  auto run = [&](RoundAggregation& s, const std::vector<std::vector<float>>& updates) {
    EXPECT_TRUE(s.Begin(1, Zeros(layout)).ok());
    for (const auto& u : updates) EXPECT_TRUE(s.Accept(set(u), 1).ok());
    StatusOr<WeightSet> result = s.Finish();
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    return result.ok() ? FlatDoubles(*result) : std::vector<double>{};
  };
  const std::vector<std::vector<float>> four = {{1, -1, 0.5f, 7}, {5, -2, 0.25f, 7}, {2, -3, 1, 7}, {4, -100, 2, 7}};
  AggregatingStrategy<Median> median;
  EXPECT_EQ(run(median, four), (std::vector<double>{3, -2.5, 0.75, 7}));
  EXPECT_EQ(run(median, {four[0], four[1], four[3]}), (std::vector<double>{4, -2, 0.5, 7}));
  AggregatingStrategy<TrimmedMean> trimmed(TrimmedMeanOptions{.beta = 0.25});  // k = floor(0.25 * 4) = 1 from each end
  EXPECT_EQ(run(trimmed, four), (std::vector<double>{3, -2.5, 0.75, 7}));
  AggregatingStrategy<TrimmedMean> untrimmed(TrimmedMeanOptions{.beta = 0.2});  // k = floor(0.8) = 0: the plain mean
  EXPECT_EQ(run(untrimmed, four), (std::vector<double>{3, -26.5, 0.9375, 7}));

  // Five points on a line: 0, 1, 2, 3 and 100. f = 1: each scores its n - f - 2 = 2 nearest squared distances.
  // 0: 1 + 4 = 5; 1: 1 + 1 = 2; 2: 1 + 1 = 2; 3: 1 + 4 = 5; 100: 97^2 + 98^2. 1 and 2 tie: the first in canonical
  // order wins, memcmp of the stored (little-endian) bytes: 2.0f is 00 00 00 40, before 1.0f's 00 00 80 3f.
  const std::vector<std::vector<float>> line = {{100, 0, 0, 0}, {3, 0, 0, 0}, {2, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}};
  AggregatingStrategy<Krum> krum(KrumOptions{.f = 1});
  EXPECT_EQ(run(krum, line), (std::vector<double>{2, 0, 0, 0}));
  AggregatingStrategy<MultiKrum> multi(MultiKrumOptions{.f = 1, .m = 0});  // m = n - f = 4: all but 100
  EXPECT_EQ(run(multi, line), (std::vector<double>{1.5, 0, 0, 0}));
  AggregatingStrategy<MultiKrum> two(MultiKrumOptions{.f = 1, .m = 2});
  EXPECT_EQ(run(two, line), (std::vector<double>{1.5, 0, 0, 0}));
}

TEST(RobustAggregationTest, ArrivalOrderDoesNotChangeBits) {
  std::mt19937 rng(7);
  std::vector<WeightSet> updates;
  for (int i = 0; i < 8; ++i) updates.push_back(RandomLayoutSet(rng));
  // Two identical updates with different sample counts, so ties in Krum's score and equal values appear.
  updates.push_back(updates[3].Clone());
  // Krum over 3 updates with f = 0: each scores its distance to its nearest neighbour, so the two closest always tie
  // and only the canonical order decides.
  const std::vector<std::pair<RobustCase, size_t>> list = {
      {{"median"}, 9},     {{"trimmed_mean", 0.2}, 9},   {{"krum", 0, 2}, 9},
      {{"krum", 0, 0}, 3}, {{"multi_krum", 0, 2, 0}, 9}, {{"multi_krum", 0, 1, 3}, 9}};
  for (const auto& [c, count] : list) {
    SCOPED_TRACE(Describe(c, static_cast<int>(count)));
    std::vector<size_t> order(count);
    std::iota(order.begin(), order.end(), size_t{0});
    std::optional<WeightSet> first;
    for (int permutation = 0; permutation < 6; ++permutation) {
      std::shared_ptr<RoundAggregation> strategy = Make(c);
      ASSERT_TRUE(strategy->Begin(2, Zeros()).ok());
      for (size_t i : order) ASSERT_TRUE(strategy->Accept(updates[i], 10 + static_cast<int64_t>(i)).ok());
      StatusOr<WeightSet> result = strategy->Finish();
      ASSERT_TRUE(result.ok()) << result.status().ToString();
      if (first) {
        EXPECT_TRUE(SameBytes(*first, *result)) << "permutation " << permutation;
      } else {
        first = std::move(*result);
      }
      if (count <= 3) {
        std::next_permutation(order.begin(), order.end());  // all 6 orders
      } else {
        std::shuffle(order.begin(), order.end(), rng);
      }
    }
  }
}

// 8 honest updates near h, 2 attackers sending -10 * (their honest update) or its sign flip. The robust rules stay
// near the honest mean; FedAvg is dragged away.
TEST(RobustAggregationTest, TwoOfTenAttackersMoveFedAvgButNotRobustRules) {
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<Entry> layout = {{"a", DType::kF32, {64, 33}}, {"b", DType::kBF16, {300}}};
  std::vector<float> h;
  for (int j = 0; j < 64 * 33 + 300; ++j) h.push_back(normal(rng));
  auto offset = [](size_t t, size_t j) { return t == 0 ? j : 64 * 33 + j; };
  std::vector<std::vector<double>> honest_flat;
  std::vector<WeightSet> honest;
  for (int i = 0; i < 8; ++i) {
    honest.push_back(MakeLayoutSet(layout, [&](size_t t, size_t j) { return h[offset(t, j)] + 0.05f * normal(rng); }));
    honest_flat.push_back(FlatDoubles(honest.back()));
  }
  std::vector<double> honest_mean(h.size(), 0.0);
  for (const auto& f : honest_flat) {
    for (size_t j = 0; j < h.size(); ++j) honest_mean[j] += f[j] / 8;
  }
  auto relative_error = [&](const WeightSet& result) {
    const std::vector<double> got = FlatDoubles(result);
    double diff = 0, norm = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      diff += (got[j] - honest_mean[j]) * (got[j] - honest_mean[j]);
      norm += honest_mean[j] * honest_mean[j];
    }
    return std::sqrt(diff / norm);
  };

  for (const float scale : {-10.0f, -1.0f}) {
    SCOPED_TRACE("attack scale " + std::to_string(scale));
    std::vector<WeightSet> attackers;
    for (int i = 0; i < 2; ++i) {
      const std::vector<double> base = FlatDoubles(honest[i]);
      attackers.push_back(MakeLayoutSet(layout, [&](size_t t, size_t j) { return scale * float(base[offset(t, j)]); }));
    }
    auto aggregate = [&](RoundAggregation& s) {
      EXPECT_TRUE(s.Begin(1, Zeros(layout)).ok());
      for (const WeightSet& u : honest) EXPECT_TRUE(s.Accept(u, 100).ok());
      for (const WeightSet& u : attackers) EXPECT_TRUE(s.Accept(u, 100).ok());
      StatusOr<WeightSet> result = s.Finish();
      EXPECT_TRUE(result.ok()) << result.status().ToString();
      return relative_error(*result);
    };
    AggregatingStrategy<FedAvg> fed_avg;
    AggregatingStrategy<Median> median;
    AggregatingStrategy<TrimmedMean> trimmed(TrimmedMeanOptions{.beta = 0.2});
    AggregatingStrategy<Krum> krum(KrumOptions{.f = 2});
    AggregatingStrategy<MultiKrum> multi_krum(MultiKrumOptions{.f = 2});
    const double fed_avg_error = aggregate(fed_avg);
    std::printf("[ attack   ] scale %5.1f: |result - honest mean| / |honest mean|: fedavg %.3f", scale, fed_avg_error);
    EXPECT_GT(fed_avg_error, 0.35);  // 0.2 * |scale - 1|: 2.2 and 0.4
    for (RoundAggregation* s : std::initializer_list<RoundAggregation*>{&median, &trimmed, &krum, &multi_krum}) {
      const double error = aggregate(*s);
      std::printf(", %s %.3f", std::string(s->strategy().name()).c_str(), error);
      EXPECT_LT(error, 0.1) << s->strategy().name();
    }
    std::printf("\n");
  }
}

TEST(RobustAggregationTest, BadUpdatesAreRejectedAndDoNotCount) {
  std::mt19937 rng(3);
  for (const RobustCase& c :
       std::vector<RobustCase>{{"median"}, {"trimmed_mean", 0.1}, {"krum", 0, 0}, {"multi_krum", 0, 0, 2}}) {
    SCOPED_TRACE(c.strategy);
    std::shared_ptr<RoundAggregation> s = Make(c);
    ASSERT_TRUE(s->Begin(4, Zeros()).ok());
    EXPECT_EQ(s->Accept(RandomLayoutSet(rng), 0).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s->AcceptOwned(RandomLayoutSet(rng), -5, std::nullopt).code(), StatusCode::kInvalidArgument);

    WeightSet short_set =
        MakeLayoutSet({TestLayout().begin(), TestLayout().end() - 1}, [](size_t, size_t) { return 1.0f; });
    Status missing = s->Accept(short_set, 10);
    EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(missing.message().find("missing tensor 'g'"), std::string::npos) << missing.ToString();

    std::vector<Entry> reshaped = TestLayout();
    reshaped[0].shape = {5, 3};
    Status shape = s->AcceptOwned(MakeLayoutSet(reshaped, [](size_t, size_t) { return 1.0f; }), 10, std::nullopt);
    EXPECT_NE(shape.message().find("tensor 'a' has shape [5, 3], expected [3, 5]"), std::string::npos)
        << shape.ToString();

    Status nan =
        s->Accept(MakeLayoutSet(TestLayout(), [](size_t t, size_t j) { return t == 4 && j == 17 ? NAN : 1.0f; }), 3);
    EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(nan.message().find("tensor 'e' has a non-finite value (nan) at index 17"), std::string::npos)
        << nan.ToString();
    EXPECT_NE(nan.message().find("round 4 update"), std::string::npos) << nan.ToString();
    EXPECT_EQ(s->num_accepted(), 0);

    for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Accept(RandomLayoutSet(rng), 5).ok());
    EXPECT_EQ(s->num_accepted(), 3);
    EXPECT_TRUE(s->Finish().ok());
    EXPECT_EQ(s->num_accepted(), 0);
  }
}

TEST(RobustAggregationTest, LifecycleAndCountErrors) {
  std::mt19937 rng(5);
  AggregatingStrategy<Median> median;
  EXPECT_EQ(median.Accept(RandomLayoutSet(rng), 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(median.Finish().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(median.Begin(1, Zeros()).ok());
  EXPECT_EQ(median.Finish().status().code(), StatusCode::kFailedPrecondition);  // nothing accepted

  // Krum with f = 2 needs 7 updates: 6 fail with a message that says what to change; the updates stay, a seventh
  // makes Finish succeed.
  AggregatingStrategy<Krum> krum(KrumOptions{.f = 2});
  ASSERT_TRUE(krum.Begin(9, Zeros()).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(krum.Accept(RandomLayoutSet(rng), 1).ok());
  StatusOr<WeightSet> few = krum.Finish();
  EXPECT_EQ(few.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(few.status().message().find("krum with f = 2 needs at least 2f + 3 = 7 updates, got 6"), std::string::npos)
      << few.status().ToString();
  EXPECT_NE(few.status().message().find("round 9"), std::string::npos) << few.status().ToString();
  ASSERT_TRUE(krum.Accept(RandomLayoutSet(rng), 1).ok());
  EXPECT_TRUE(krum.Finish().ok());

  AggregatingStrategy<MultiKrum> many(MultiKrumOptions{.f = 0, .m = 5});
  ASSERT_TRUE(many.Begin(1, Zeros()).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(many.Accept(RandomLayoutSet(rng), 1).ok());
  EXPECT_NE(many.Finish().status().message().find("multi_krum with m = 5 needs at least 5 updates, got 4"),
            std::string::npos);

  // Begin discards a failed round's updates.
  ASSERT_TRUE(many.Begin(2, Zeros()).ok());
  EXPECT_EQ(many.num_accepted(), 0);

  WeightSet ints;
  ASSERT_TRUE(ints.AddZeros("steps", DType::kI64, {1}).ok());
  Status non_float = median.Begin(1, ints);
  EXPECT_EQ(non_float.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(non_float.message().find("global tensor 'steps' has dtype I64; median aggregates F32, BF16 and F16"),
            std::string::npos)
      << non_float.ToString();
}

TEST(RobustAggregationTest, OptionsAreValidatedNamingTheOption) {
  EXPECT_TRUE(TrimmedMean::Validate({.beta = 0.0}).ok());
  EXPECT_TRUE(TrimmedMean::Validate({.beta = 0.49}).ok());
  for (double beta : {-0.1, 0.5, 0.7, double(NAN)}) {
    Status s = TrimmedMean::Validate({.beta = beta});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("beta must be", 0), 0u) << s.ToString();
  }
  EXPECT_TRUE(Krum::Validate({.f = 0}).ok());
  EXPECT_EQ(Krum::Validate({.f = -1}).message().rfind("f (the assumed number of Byzantine updates)", 0), 0u);
  EXPECT_TRUE(MultiKrum::Validate({.f = 3, .m = 0}).ok());
  EXPECT_EQ(MultiKrum::Validate({.f = 1, .m = -2}).message().rfind("m (the number of updates averaged)", 0), 0u);
  EXPECT_EQ(MultiKrum::Validate({.f = -1, .m = 2}).message().rfind("f ", 0), 0u);

  // A strategy built with bad options refuses to begin, with the same message.
  AggregatingStrategy<TrimmedMean> bad(TrimmedMeanOptions{.beta = 0.5});
  Status begin = bad.Begin(1, Zeros());
  EXPECT_EQ(begin.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin.message().rfind("beta must be", 0), 0u) << begin.ToString();
}

TEST(RobustAggregationTest, ConfigureRoundIsFedAvgs) {
  std::vector<Candidate> available;
  for (int shard = 0; shard < 7; ++shard) available.push_back({.worker_id = 100 + (shard * 3) % 7, .shard = shard});
  std::reverse(available.begin(), available.end());
  const FedAvg fed_avg;
  const Median median;
  const MultiKrum multi_krum;
  for (const RoundContext& ctx : {RoundContext{.job_seed = 9, .round = 1, .min_workers = 8, .max_workers = 8},
                                  RoundContext{.job_seed = 9, .round = 3, .min_workers = 2, .max_workers = 3},
                                  RoundContext{.job_seed = 4, .round = 2, .min_workers = 1, .max_workers = 10}}) {
    const std::vector<ParticipantConfig> expected = fed_avg.ConfigureRound(ctx, available);
    EXPECT_EQ(median.ConfigureRound(ctx, available), expected);
    EXPECT_EQ(multi_krum.ConfigureRound(ctx, available), expected);
  }
}

}  // namespace
}  // namespace parsyn::strategy
