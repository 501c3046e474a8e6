#include "strategy/fed_avg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "strategy/aggregating_strategy_for_test.h"
#include "strategy/seed.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::WeightSet;

// Two f32 tensors, like a LoRA pair: a (2, 3) and b (4).
WeightSet MakeSet(const std::vector<float>& a, const std::vector<float>& b) {
  WeightSet set;
  EXPECT_TRUE(set.Add("layer.lora_A.weight", DType::kF32, {2, 3}, std::as_bytes(std::span(a))).ok());
  EXPECT_TRUE(set.Add("layer.lora_B.weight", DType::kF32, {4}, std::as_bytes(std::span(b))).ok());
  return set;
}

std::vector<float> Flat(const WeightSet& set) {
  std::vector<float> out;
  for (const weights::Tensor& t : set.tensors()) {
    auto values = t.as<float>();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

struct Update {
  WeightSet weights;
  int64_t samples;
};

std::vector<Update> RandomUpdates(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_int_distribution<int64_t> samples(1, 1000);
  std::vector<Update> updates;
  for (int i = 0; i < count; ++i) {
    std::vector<float> a(6), b(4);
    for (float& x : a) x = value(rng);
    for (float& x : b) x = value(rng);
    updates.push_back({MakeSet(a, b), samples(rng)});
  }
  return updates;
}

WeightSet Global() { return MakeSet(std::vector<float>(6, 0.0f), std::vector<float>(4, 0.0f)); }

TEST(FedAvgTest, EqualsIndependentFloat64WeightedMean) {
  std::vector<Update> updates = RandomUpdates(7, 1);
  AggregatingStrategy<FedAvg> fed_avg;
  ASSERT_TRUE(fed_avg.Begin(3, Global()).ok());
  for (const Update& u : updates) ASSERT_TRUE(fed_avg.Accept(u.weights, u.samples).ok());
  EXPECT_EQ(fed_avg.num_accepted(), 7);
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_TRUE(result->CheckSameLayout(Global()).ok());

  // Reference: sum(n_i * w_i) / sum(n_i) in float64, element by element.
  std::vector<double> sum(10, 0.0);
  double total = 0.0;
  for (const Update& u : updates) {
    std::vector<float> w = Flat(u.weights);
    for (size_t j = 0; j < w.size(); ++j) sum[j] += static_cast<double>(u.samples) * w[j];
    total += static_cast<double>(u.samples);
  }
  std::vector<float> got = Flat(*result);
  ASSERT_EQ(got.size(), sum.size());
  for (size_t j = 0; j < got.size(); ++j) {
    const double expected = sum[j] / total;
    // The result is fp32: within a few fp32 ulps of the float64 mean (values are O(1)).
    EXPECT_NEAR(got[j], expected, 4e-7 * std::max(1.0, std::abs(expected))) << "element " << j;
  }
}

TEST(FedAvgTest, WeightsBySampleCountNotByUpdate) {
  AggregatingStrategy<FedAvg> fed_avg;
  ASSERT_TRUE(fed_avg.Begin(1, Global()).ok());
  ASSERT_TRUE(fed_avg.Accept(MakeSet(std::vector<float>(6, 1.0f), std::vector<float>(4, 1.0f)), 3).ok());
  ASSERT_TRUE(fed_avg.Accept(MakeSet(std::vector<float>(6, 5.0f), std::vector<float>(4, -3.0f)), 1).ok());
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::vector<float> got = Flat(*result);
  for (int j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(got[j], 2.0f);   // (3*1 + 1*5) / 4
  for (int j = 6; j < 10; ++j) EXPECT_FLOAT_EQ(got[j], 0.0f);  // (3*1 + 1*-3) / 4
}

// Owned updates may be added later in a batch, but are judged at once and count exactly like Accept's.
TEST(FedAvgTest, AcceptOwnedJudgesNowAndAveragesLikeAccept) {
  AggregatingStrategy<FedAvg> fed_avg;
  ASSERT_TRUE(fed_avg.Begin(1, Global()).ok());
  ASSERT_TRUE(
      fed_avg.AcceptOwned(MakeSet(std::vector<float>(6, 1.0f), std::vector<float>(4, 1.0f)), 3, std::nullopt).ok());
  EXPECT_EQ(
      fed_avg.AcceptOwned(MakeSet(std::vector<float>(6, 1.0f), std::vector<float>(4, 1.0f)), 0, std::nullopt).code(),
      StatusCode::kInvalidArgument);
  std::vector<float> with_nan(6, 1.0f);
  with_nan[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(fed_avg.AcceptOwned(MakeSet(with_nan, std::vector<float>(4, 1.0f)), 10, std::nullopt).code(),
            StatusCode::kInvalidArgument);
  fed_avg.AddKeptUpdates();
  ASSERT_TRUE(fed_avg.Accept(MakeSet(std::vector<float>(6, 5.0f), std::vector<float>(4, -3.0f)), 1).ok());
  EXPECT_EQ(fed_avg.num_accepted(), 2);
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::vector<float> got = Flat(*result);
  for (int j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(got[j], 2.0f);   // (3*1 + 1*5) / 4
  for (int j = 6; j < 10; ++j) EXPECT_FLOAT_EQ(got[j], 0.0f);  // (3*1 + 1*-3) / 4
}

// Begin after Finish reuses the sums' memory; nothing of the previous round may leak into the next.
TEST(FedAvgTest, EachRoundStartsFromNothing) {
  AggregatingStrategy<FedAvg> fed_avg;
  ASSERT_TRUE(fed_avg.Begin(1, Global()).ok());
  ASSERT_TRUE(
      fed_avg.AcceptOwned(MakeSet(std::vector<float>(6, 7.0f), std::vector<float>(4, 7.0f)), 5, std::nullopt).ok());
  ASSERT_TRUE(fed_avg.Finish().ok());
  EXPECT_EQ(fed_avg.Accept(Global(), 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fed_avg.num_accepted(), 0);
  ASSERT_TRUE(fed_avg.Begin(2, Global()).ok());
  EXPECT_EQ(fed_avg.num_accepted(), 0);
  ASSERT_TRUE(
      fed_avg.AcceptOwned(MakeSet(std::vector<float>(6, 1.0f), std::vector<float>(4, 2.0f)), 1, std::nullopt).ok());
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::vector<float> got = Flat(*result);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(got[j], 1.0f);
  for (int j = 6; j < 10; ++j) EXPECT_EQ(got[j], 2.0f);
}

TEST(FedAvgTest, ArrivalOrderDoesNotChangeBits) {
  std::vector<Update> updates = RandomUpdates(6, 2);
  std::vector<size_t> order(updates.size());
  std::iota(order.begin(), order.end(), 0);

  auto aggregate = [&](const std::vector<size_t>& in_order) {
    AggregatingStrategy<FedAvg> fed_avg;
    EXPECT_TRUE(fed_avg.Begin(1, Global()).ok());
    for (size_t i : in_order) EXPECT_TRUE(fed_avg.Accept(updates[i].weights, updates[i].samples).ok());
    StatusOr<WeightSet> result = fed_avg.Finish();
    EXPECT_TRUE(result.ok());
    return Flat(*result);
  };

  const std::vector<float> first = aggregate(order);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    const std::vector<float> again = aggregate(order);
    ASSERT_EQ(again.size(), first.size());
    EXPECT_EQ(std::memcmp(again.data(), first.data(), first.size() * sizeof(float)), 0) << "trial " << trial;
  }
}

TEST(FedAvgTest, BadUpdatesAreRejectedAndDoNotCount) {
  std::vector<Update> good = RandomUpdates(3, 3);

  AggregatingStrategy<FedAvg> reference;
  ASSERT_TRUE(reference.Begin(1, Global()).ok());
  for (const Update& u : good) ASSERT_TRUE(reference.Accept(u.weights, u.samples).ok());
  std::vector<float> expected = Flat(*reference.Finish());

  AggregatingStrategy<FedAvg> fed_avg;
  ASSERT_TRUE(fed_avg.Begin(1, Global()).ok());
  ASSERT_TRUE(fed_avg.Accept(good[0].weights, good[0].samples).ok());

  // Wrong shape.
  WeightSet wrong_shape;
  std::vector<float> a(6, 1.0f), b(3, 1.0f);
  ASSERT_TRUE(wrong_shape.Add("layer.lora_A.weight", DType::kF32, {2, 3}, std::as_bytes(std::span(a))).ok());
  ASSERT_TRUE(wrong_shape.Add("layer.lora_B.weight", DType::kF32, {3}, std::as_bytes(std::span(b))).ok());
  Status s = fed_avg.Accept(wrong_shape, 10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer.lora_B.weight"), std::string::npos) << s.message();

  // Missing tensor.
  WeightSet missing;
  ASSERT_TRUE(missing.Add("layer.lora_A.weight", DType::kF32, {2, 3}, std::as_bytes(std::span(a))).ok());
  EXPECT_EQ(fed_avg.Accept(missing, 10).code(), StatusCode::kInvalidArgument);

  // A NaN.
  std::vector<float> with_nan(6, 1.0f);
  with_nan[4] = std::numeric_limits<float>::quiet_NaN();
  s = fed_avg.Accept(MakeSet(with_nan, std::vector<float>(4, 1.0f)), 10);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer.lora_A.weight"), std::string::npos) << s.message();

  // An infinity.
  std::vector<float> with_inf(4, 1.0f);
  with_inf[0] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fed_avg.Accept(MakeSet(std::vector<float>(6, 1.0f), with_inf), 10).code(), StatusCode::kInvalidArgument);

  // Non-positive sample counts.
  s = fed_avg.Accept(good[1].weights, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sample count must be positive, got 0");
  EXPECT_EQ(fed_avg.Accept(good[1].weights, -5).code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(fed_avg.num_accepted(), 1);
  ASSERT_TRUE(fed_avg.Accept(good[1].weights, good[1].samples).ok());
  ASSERT_TRUE(fed_avg.Accept(good[2].weights, good[2].samples).ok());
  EXPECT_EQ(fed_avg.num_accepted(), 3);
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok());
  std::vector<float> got = Flat(*result);
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
}

TEST(FedAvgTest, LifecycleErrors) {
  AggregatingStrategy<FedAvg> fed_avg;
  WeightSet update = Global();
  EXPECT_EQ(fed_avg.Accept(update, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fed_avg.Finish().status().code(), StatusCode::kFailedPrecondition);

  ASSERT_TRUE(fed_avg.Begin(2, Global()).ok());
  StatusOr<WeightSet> empty = fed_avg.Finish();
  EXPECT_EQ(empty.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(empty.status().message(), "round 2 has no accepted update to average");

  // Begin again discards what a failed attempt had accumulated.
  ASSERT_TRUE(fed_avg.Begin(2, Global()).ok());
  ASSERT_TRUE(fed_avg.Accept(MakeSet(std::vector<float>(6, 9.0f), std::vector<float>(4, 9.0f)), 5).ok());
  ASSERT_TRUE(fed_avg.Begin(2, Global()).ok());
  EXPECT_EQ(fed_avg.num_accepted(), 0);
  ASSERT_TRUE(fed_avg.Accept(MakeSet(std::vector<float>(6, 1.0f), std::vector<float>(4, 1.0f)), 5).ok());
  StatusOr<WeightSet> result = fed_avg.Finish();
  ASSERT_TRUE(result.ok());
  for (float x : Flat(*result)) EXPECT_EQ(x, 1.0f);
  // Finish ends the aggregation.
  EXPECT_EQ(fed_avg.Finish().status().code(), StatusCode::kFailedPrecondition);
}

TEST(FedAvgTest, BeginRejectsNonFloatGlobal) {
  WeightSet global;
  std::vector<int64_t> ids(3, 0);
  ASSERT_TRUE(global.Add("position_ids", DType::kI64, {3}, std::as_bytes(std::span(ids))).ok());
  AggregatingStrategy<FedAvg> fed_avg;
  Status s = fed_avg.Begin(1, global);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "global tensor 'position_ids' has dtype I64; FedAvg averages float tensors only");
}

std::vector<Candidate> Candidates(std::vector<std::pair<int64_t, int>> worker_shard) {
  std::vector<Candidate> out;
  for (auto [w, s] : worker_shard) out.push_back({.worker_id = w, .shard = s});
  return out;
}

TEST(FedAvgTest, ConfigureRoundWaitsBelowMinWorkers) {
  AggregatingStrategy<FedAvg> fed_avg;
  auto available = Candidates({{10, 0}});
  EXPECT_TRUE(
      fed_avg.ConfigureRound({.job_seed = 1, .round = 1, .min_workers = 2, .max_workers = 3}, available).empty());
  EXPECT_TRUE(fed_avg.ConfigureRound({.job_seed = 1, .round = 1, .min_workers = 1, .max_workers = 3}, {}).empty());
}

TEST(FedAvgTest, ConfigureRoundTakesAllThatFitSortedByShardWithTaskSeeds) {
  AggregatingStrategy<FedAvg> fed_avg;
  auto available = Candidates({{30, 2}, {10, 0}, {20, 1}});
  std::vector<ParticipantConfig> got =
      fed_avg.ConfigureRound({.job_seed = 99, .round = 4, .min_workers = 2, .max_workers = 5}, available);
  std::vector<ParticipantConfig> expected = {
      {.worker_id = 10, .shard = 0, .seed = TaskSeed(99, 4, 0)},
      {.worker_id = 20, .shard = 1, .seed = TaskSeed(99, 4, 1)},
      {.worker_id = 30, .shard = 2, .seed = TaskSeed(99, 4, 2)},
  };
  EXPECT_EQ(got, expected);
}

TEST(FedAvgTest, ConfigureRoundRotatesWhenMoreAvailableThanMax) {
  AggregatingStrategy<FedAvg> fed_avg;
  auto available = Candidates({{10, 0}, {11, 1}, {12, 2}, {13, 3}, {14, 4}});
  auto shards_of = [&](int round) {
    std::vector<int> shards;
    for (const auto& p :
         fed_avg.ConfigureRound({.job_seed = 1, .round = round, .min_workers = 1, .max_workers = 2}, available)) {
      shards.push_back(p.shard);
    }
    return shards;
  };
  EXPECT_EQ(shards_of(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(shards_of(2), (std::vector<int>{2, 3}));
  EXPECT_EQ(shards_of(3), (std::vector<int>{0, 4}));
  // Deterministic.
  EXPECT_EQ(shards_of(2), shards_of(2));
}

TEST(SeedTest, TaskSeedsAreDistinctAndPinned) {
  std::set<uint64_t> seen;
  for (int round = 1; round <= 50; ++round) {
    for (int shard = 0; shard < 50; ++shard) seen.insert(TaskSeed(42, round, shard));
  }
  EXPECT_EQ(seen.size(), 2500u);
  EXPECT_NE(TaskSeed(42, 1, 0), TaskSeed(43, 1, 0));
  EXPECT_NE(SplitSeed(42), TaskSeed(42, 0, 0));
  // Pinned values: the seeds are part of the reproducibility contract (a rerun of a stored job must derive the same).
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(TaskSeed(42, 1, 0), 0x644e42ee932c8790ULL);
}

}  // namespace
}  // namespace parsyn::strategy
