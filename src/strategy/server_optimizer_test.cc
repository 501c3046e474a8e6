// The strategy framework: the server optimizers against an independent NumPy reference
// (tests/reference/server_optimizers.py), their state across rounds and restarts, client sampling and MakeStrategy.
#include "strategy/server_optimizer.h"
#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "strategy/aggregating_strategy_for_test.h"
#include "strategy/dp_fed_avg.h"
#include "strategy/make_strategy.h"
#include "strategy/robust_aggregation.h"
#include "strategy/sampling.h"
#include "strategy/seed.h"
#include "weights/safetensors.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::WeightSet;

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel;
};
const std::vector<Layout> kLayout = {{"layer.lora_A.weight", {2, 3}, 6}, {"layer.lora_B.weight", {5}, 5}};

WeightSet MakeLoraPairSet(const std::vector<std::vector<float>>& values) {
  WeightSet set;
  for (size_t i = 0; i < kLayout.size(); ++i) {
    EXPECT_TRUE(set.Add(kLayout[i].name, DType::kF32, kLayout[i].shape, std::as_bytes(std::span(values[i]))).ok());
  }
  return set;
}

// Dyadic values (k/16) keep the FedAvg mean exact in both implementations; otherwise uniform in [-1, 1].
WeightSet RandomLoraPairSet(std::mt19937& rng, bool dyadic) {
  std::uniform_int_distribution<int> k(-16, 16);
  std::uniform_real_distribution<float> x(-1.0f, 1.0f);
  std::vector<std::vector<float>> values;
  for (const Layout& l : kLayout) {
    std::vector<float> v(static_cast<size_t>(l.numel));
    for (float& e : v) e = dyadic ? static_cast<float>(k(rng)) / 16.0f : x(rng);
    values.push_back(std::move(v));
  }
  return MakeLoraPairSet(values);
}

struct OptimizerCase {
  std::string label;
  StrategyKind kind;
  StrategyOptions options;
  bool dyadic;
};

StrategyOptions With(StrategyKind kind, double lr, double momentum, double beta1, double beta2, double tau) {
  StrategyOptions o = DefaultStrategyOptions(kind);
  o.server_learning_rate = lr;
  o.server_momentum = momentum;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.tau = tau;
  return o;
}

constexpr int kRounds = 3;
const std::vector<std::vector<int64_t>> kSamples = {{1, 3}, {2, 1, 1}, {4, 2, 1, 1}};  // dyadic totals

TEST(ServerOptimizerTest, MatchesIndependentNumpyReferenceOverThreeRounds) {
  std::vector<OptimizerCase> cases;
  for (bool dyadic : {true, false}) {
    const std::string suffix = dyadic ? "_dyadic" : "_random";
    cases.push_back(
        {"fedavgm_defaults" + suffix, StrategyKind::kFedAvgM, DefaultStrategyOptions(StrategyKind::kFedAvgM), dyadic});
    cases.push_back(
        {"fedavgm_lr0.5" + suffix, StrategyKind::kFedAvgM, With(StrategyKind::kFedAvgM, 0.5, 0.7, 0, 0, 0), dyadic});
    cases.push_back(
        {"fedadam_defaults" + suffix, StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam), dyadic});
    cases.push_back({"fedadam_custom" + suffix, StrategyKind::kFedAdam,
                     With(StrategyKind::kFedAdam, 0.03, 0, 0.5, 0.9, 1e-3), dyadic});
    cases.push_back(
        {"fedyogi_defaults" + suffix, StrategyKind::kFedYogi, DefaultStrategyOptions(StrategyKind::kFedYogi), dyadic});
    cases.push_back({"fedyogi_custom" + suffix, StrategyKind::kFedYogi,
                     With(StrategyKind::kFedYogi, 0.1, 0, 0.8, 0.5, 1e-2), dyadic});
    cases.push_back({"fedadagrad_defaults" + suffix, StrategyKind::kFedAdagrad,
                     DefaultStrategyOptions(StrategyKind::kFedAdagrad), dyadic});
    cases.push_back({"fedadagrad_beta1" + suffix, StrategyKind::kFedAdagrad,
                     With(StrategyKind::kFedAdagrad, 0.05, 0, 0.9, 0, 1e-6), dyadic});
  }

  test_support::TempDir dir("server-optimizers");
  std::string command =
      std::string("/usr/bin/python3 ") + test_support::SourcePath("tests/reference/server_optimizers.py");
  std::map<std::string, std::vector<WeightSet>> ours;  // by case: the global after each round, then the state
  std::map<std::string, std::vector<WeightSet>> our_states;
  for (size_t c = 0; c < cases.size(); ++c) {
    const OptimizerCase& k = cases[c];
    std::mt19937 rng(static_cast<uint32_t>(100 + c));
    WeightSet input;
    WeightSet global = RandomLoraPairSet(rng, k.dyadic);
    for (const weights::Tensor& t : global.tensors()) {
      ASSERT_TRUE(input.Add("global/" + t.name, t.dtype, t.shape, t.data).ok());
    }
    const StrategyOptions& o = k.options;
    input.metadata() = {{"kind", std::string(StrategyKindName(k.kind))},
                        {"lr", std::to_string(o.server_learning_rate)},
                        {"momentum", std::to_string(o.server_momentum)},
                        {"beta1", std::to_string(o.beta1)},
                        {"beta2", std::to_string(o.beta2)},
                        {"tau", std::to_string(o.tau)},
                        {"rounds", std::to_string(kRounds)}};
    // The options as the reference reads them (decimal text) are the options this side uses.
    StrategyOptions parsed = o;
    parsed.server_learning_rate = std::stod(input.metadata()["lr"]);
    parsed.server_momentum = std::stod(input.metadata()["momentum"]);
    parsed.beta1 = std::stod(input.metadata()["beta1"]);
    parsed.beta2 = std::stod(input.metadata()["beta2"]);
    parsed.tau = std::stod(input.metadata()["tau"]);
    if (o.tau < 1e-6) {  // std::to_string keeps 6 decimals: pass tiny tau in scientific form
      std::ostringstream tau;
      tau.precision(17);
      tau << o.tau;
      input.metadata()["tau"] = tau.str();
      parsed.tau = o.tau;
    }
    AggregatingStrategy<ServerOptimizer> optimizer(k.kind, parsed);
    for (int r = 1; r <= kRounds; ++r) {
      ASSERT_TRUE(optimizer.Begin(r, global).ok());
      std::string samples;
      for (size_t i = 0; i < kSamples[r - 1].size(); ++i) {
        WeightSet update = RandomLoraPairSet(rng, k.dyadic);
        for (const weights::Tensor& t : update.tensors()) {
          ASSERT_TRUE(input
                          .Add("round" + std::to_string(r) + "/update" + std::to_string(i) + "/" + t.name, t.dtype,
                               t.shape, t.data)
                          .ok());
        }
        ASSERT_TRUE(optimizer.AcceptOwned(std::move(update), kSamples[r - 1][i], std::nullopt).ok());
        samples += (i ? "," : "") + std::to_string(kSamples[r - 1][i]);
      }
      input.metadata()["samples" + std::to_string(r)] = samples;
      StatusOr<WeightSet> next = optimizer.Finish();
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      ASSERT_NE(optimizer.PendingState(), nullptr);
      our_states[k.label].push_back(optimizer.PendingState()->Clone());
      optimizer.CommitState();
      ours[k.label].push_back(next->Clone());
      global = std::move(*next);
    }
    const auto in_path = dir.path() / (k.label + ".in.safetensors");
    ASSERT_TRUE(weights::WriteSafetensorsFile(input, in_path).ok());
    command += " " + in_path.string() + " " + (dir.path() / (k.label + ".out.safetensors")).string();
  }
  const auto log = dir.path() / "python.log";
  ASSERT_EQ(std::system((command + " > " + log.string() + " 2>&1").c_str()), 0)
      << command << "\n"
      << (std::stringstream() << std::ifstream(log).rdbuf()).str();

  for (const OptimizerCase& k : cases) {
    SCOPED_TRACE(k.label);
    StatusOr<WeightSet> reference = weights::ReadSafetensorsFile(dir.path() / (k.label + ".out.safetensors"));
    ASSERT_TRUE(reference.ok()) << reference.status().ToString();
    double max_relative = 0;
    int differing = 0, total = 0;
    for (int r = 1; r <= kRounds; ++r) {
      const WeightSet& global = ours[k.label][r - 1];
      const WeightSet& state = our_states[k.label][r - 1];
      std::vector<std::pair<const weights::Tensor*, std::string>> pairs;
      for (const Layout& l : kLayout) {
        pairs.push_back({global.Find(l.name), "round" + std::to_string(r) + "/global/" + l.name});
        pairs.push_back({state.Find("v/" + l.name), "round" + std::to_string(r) + "/v/" + l.name});
        if (k.kind != StrategyKind::kFedAvgM) {
          pairs.push_back({state.Find("m/" + l.name), "round" + std::to_string(r) + "/m/" + l.name});
        }
      }
      for (const auto& [mine, key] : pairs) {
        ASSERT_NE(mine, nullptr) << key;
        const weights::Tensor* want = reference->Find(key);
        ASSERT_NE(want, nullptr) << key;
        auto a = mine->as<float>();
        auto b = want->as<float>();
        ASSERT_EQ(a.size(), b.size()) << key;
        for (size_t i = 0; i < a.size(); ++i) {
          ++total;
          if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
          const double scale = std::max({std::abs(static_cast<double>(b[i])), 1e-3});
          max_relative = std::max(max_relative, std::abs(static_cast<double>(a[i]) - b[i]) / scale);
        }
      }
    }
    std::printf("[ numpy    ] %-28s %3d of %3d values differ in bits, max relative difference %.3g\n", k.label.c_str(),
                differing, total, max_relative);
    if (k.dyadic) {
      // The FedAvg mean is exact on both sides and every later step is the same fp32 operations in the same order.
      EXPECT_EQ(differing, 0);
    } else {
      // The means may differ in their last bit (exact accumulation here, float64 sums there); the steps divide by
      // sqrt(v), which can enlarge that: 1e-5 relative (or absolute below 1e-3).
      EXPECT_LE(max_relative, 1e-5);
    }
  }
}

// A round that fails after Finish (not committed) leaves the state as it was; a state restored from what PendingState
// gave continues bit-identically (the coordinator's restart).
TEST(ServerOptimizerTest, StateOnlyAdvancesOnCommitAndRestoresBitIdentically) {
  std::mt19937 rng(7);
  WeightSet start = RandomLoraPairSet(rng, false);
  std::vector<std::vector<WeightSet>> updates;
  for (int r = 0; r < 3; ++r) {
    updates.emplace_back();
    for (int i = 0; i < 3; ++i) updates.back().push_back(RandomLoraPairSet(rng, false));
  }
  auto run_round = [&](RoundAggregation& s, int r, const WeightSet& global) {
    EXPECT_TRUE(s.Begin(r + 1, global).ok());
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.Accept(updates[r][i], 10 + i).ok());
    StatusOr<WeightSet> next = s.Finish();
    EXPECT_TRUE(next.ok());
    return std::move(*next);
  };
  auto bytes = [](const WeightSet& set) { return weights::SerializeSafetensors(set); };

  StatusOr<std::unique_ptr<Strategy>> made =
      MakeStrategy(StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam), weights::SecretKey{});
  ASSERT_TRUE(made.ok());
  Strategy& straight = **made;
  RoundAggregation straight_rounds(straight);
  ASSERT_TRUE(straight.has_state());
  WeightSet g1 = run_round(straight_rounds, 0, start);
  straight.CommitState();
  WeightSet g2 = run_round(straight_rounds, 1, g1);
  straight.CommitState();
  WeightSet g3 = run_round(straight_rounds, 2, g2);

  // Round 2 fails once after Finish (e.g. its global could not be stored), then is retried.
  AggregatingStrategy<ServerOptimizer> retried(StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam));
  WeightSet r1 = run_round(retried, 0, start);
  retried.CommitState();
  WeightSet failed = run_round(retried, 1, r1);  // not committed
  WeightSet r2 = run_round(retried, 1, r1);
  EXPECT_EQ(bytes(failed), bytes(r2));
  retried.CommitState();
  EXPECT_EQ(bytes(run_round(retried, 2, r2)), bytes(g3));

  // A new optimizer restored from round 1's state (as stored and read back) continues as the first.
  AggregatingStrategy<ServerOptimizer> first(StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam));
  WeightSet f1 = run_round(first, 0, start);
  const std::vector<std::byte> image = bytes(*first.PendingState());
  StatusOr<WeightSet> stored = weights::ParseSafetensors(image);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  AggregatingStrategy<ServerOptimizer> resumed(StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam));
  ASSERT_TRUE(resumed.RestoreState(&*stored).ok());
  WeightSet s2 = run_round(resumed, 1, f1);
  resumed.CommitState();
  EXPECT_EQ(bytes(s2), bytes(g2));
  EXPECT_EQ(bytes(run_round(resumed, 2, s2)), bytes(g3));

  // Without the state (restored as "none"), the resumed job would differ: the check above can fail.
  AggregatingStrategy<ServerOptimizer> forgetful(StrategyKind::kFedAdam,
                                                 DefaultStrategyOptions(StrategyKind::kFedAdam));
  ASSERT_TRUE(forgetful.RestoreState(nullptr).ok());
  EXPECT_NE(bytes(run_round(forgetful, 1, f1)), bytes(g2));
}

TEST(ServerOptimizerTest, RefusesAStateThatIsNotItsOwn) {
  std::mt19937 rng(3);
  WeightSet global = RandomLoraPairSet(rng, false);
  AggregatingStrategy<ServerOptimizer> momentum(StrategyKind::kFedAvgM, DefaultStrategyOptions(StrategyKind::kFedAvgM));
  ASSERT_TRUE(momentum.Begin(1, global).ok());
  ASSERT_TRUE(momentum.Accept(RandomLoraPairSet(rng, false), 5).ok());
  ASSERT_TRUE(momentum.Finish().ok());
  const WeightSet* state = momentum.PendingState();
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->size(), kLayout.size());  // fedavgm keeps one moment per parameter

  AggregatingStrategy<ServerOptimizer> adam(StrategyKind::kFedAdam, DefaultStrategyOptions(StrategyKind::kFedAdam));
  Status refused = adam.RestoreState(state);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("fedavgm"), std::string::npos) << refused.message();

  // The right strategy, but another model's layout: Begin says which tensor is missing.
  AggregatingStrategy<ServerOptimizer> other(StrategyKind::kFedAvgM, DefaultStrategyOptions(StrategyKind::kFedAvgM));
  ASSERT_TRUE(other.RestoreState(state).ok());
  WeightSet bigger;
  std::vector<float> values(7, 0.5f);
  ASSERT_TRUE(bigger.Add("other", DType::kF32, {7}, std::as_bytes(std::span(values))).ok());
  Status begun = other.Begin(2, bigger);
  EXPECT_EQ(begun.code(), StatusCode::kInvalidArgument);

  FedAvg stateless;
  EXPECT_FALSE(stateless.has_state());
  EXPECT_EQ(stateless.RestoreState(state).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(stateless.RestoreState(nullptr).ok());
}

TEST(MakeStrategyTest, BuildsEveryKindAndHandsItsOptionsToTheClass) {
  for (const StrategyKindSpelling& k : StrategyKinds()) {
    StrategyOptions options = DefaultStrategyOptions(k.kind);
    if (k.kind == StrategyKind::kDpFedAvg) options.clip_norm = 0.5;  // required, no default
    StatusOr<std::unique_ptr<Strategy>> made = MakeStrategy(k.kind, options, weights::SecretKey{});
    ASSERT_TRUE(made.ok()) << k.name << ": " << made.status().ToString();
    const bool fed_avg = k.kind == StrategyKind::kFederatedAveraging || k.kind == StrategyKind::kFedProx;
    EXPECT_EQ((*made)->name(), fed_avg ? std::string_view("federated_averaging") : k.name);
    const bool stateful = !fed_avg && k.kind != StrategyKind::kMedian && k.kind != StrategyKind::kTrimmedMean &&
                          k.kind != StrategyKind::kKrum && k.kind != StrategyKind::kMultiKrum;
    EXPECT_EQ((*made)->has_state(), stateful) << k.name;
  }

  // The options reach the classes.
  StrategyOptions trimmed = DefaultStrategyOptions(StrategyKind::kTrimmedMean);
  trimmed.beta = 0.3;
  auto made_trimmed = MakeStrategy(StrategyKind::kTrimmedMean, trimmed, weights::SecretKey{});
  ASSERT_TRUE(made_trimmed.ok());
  EXPECT_EQ(dynamic_cast<TrimmedMean&>(**made_trimmed).options().beta, 0.3);
  StrategyOptions dp = DefaultStrategyOptions(StrategyKind::kDpFedAvg);
  dp.clip_norm = 2.5;
  dp.noise_multiplier = 0.7;
  dp.delta = 1e-6;
  auto made_dp = MakeStrategy(StrategyKind::kDpFedAvg, dp, weights::SecretKey{});
  ASSERT_TRUE(made_dp.ok());
  const DpFedAvgOptions& got = dynamic_cast<DpFedAvg&>(**made_dp).options();
  EXPECT_EQ(got.clip_norm, 2.5);
  EXPECT_EQ(got.noise_multiplier, 0.7);
  EXPECT_EQ(got.delta, 1e-6);

  // Krum's f decides how many updates Finish needs (n >= 2f + 3): with f = 1, four updates are too few.
  StrategyOptions krum = DefaultStrategyOptions(StrategyKind::kKrum);
  krum.f = 1;
  auto made_krum = MakeStrategy(StrategyKind::kKrum, krum, weights::SecretKey{});
  ASSERT_TRUE(made_krum.ok());
  WeightSet global;
  std::vector<float> zeros(3, 0.0f);
  ASSERT_TRUE(global.Add("w", DType::kF32, {3}, std::as_bytes(std::span(zeros))).ok());
  RoundAggregation krum_rounds(**made_krum);
  ASSERT_TRUE(krum_rounds.Begin(1, global).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(krum_rounds.Accept(global, 1).ok());
  EXPECT_EQ(krum_rounds.Finish().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(krum_rounds.Accept(global, 1).ok());
  EXPECT_TRUE(krum_rounds.Finish().ok());

  // Out-of-range options are refused, naming the option.
  StrategyOptions bad_beta = trimmed;
  bad_beta.beta = 0.5;
  StatusOr<std::unique_ptr<Strategy>> refused =
      MakeStrategy(StrategyKind::kTrimmedMean, bad_beta, weights::SecretKey{});
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("beta"), std::string::npos);
  StrategyOptions no_clip = DefaultStrategyOptions(StrategyKind::kDpFedAvg);
  refused = MakeStrategy(StrategyKind::kDpFedAvg, no_clip, weights::SecretKey{});
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("clip_norm"), std::string::npos);
  StrategyOptions bad_f = krum;
  bad_f.f = -1;
  EXPECT_EQ(MakeStrategy(StrategyKind::kMultiKrum, bad_f, weights::SecretKey{}).status().code(),
            StatusCode::kInvalidArgument);
}

// Client sampling applies to every kind: each ConfigureRound is ChooseParticipants (strategy/sampling.h), dp_fedavg's
// with its shards ranked under the job's private key (dp_fed_avg_test.cc): the same participants without sampling.
TEST(MakeStrategyTest, EveryKindSamplesClientsThroughChooseParticipants) {
  std::vector<Candidate> available;
  for (int i = 0; i < 10; ++i) available.push_back({.worker_id = 100 + i, .shard = i});
  for (const StrategyKindSpelling& k : StrategyKinds()) {
    StrategyOptions options = DefaultStrategyOptions(k.kind);
    if (k.kind == StrategyKind::kDpFedAvg) options.clip_norm = 1;
    auto made = MakeStrategy(k.kind, options, weights::SecretKey{});
    ASSERT_TRUE(made.ok()) << k.name;
    for (const Sampling& sampling : {Sampling{.fraction = 0.3}, Sampling{.count = 4}, Sampling{}}) {
      for (int round = 1; round <= 3; ++round) {
        const RoundContext ctx{.job_seed = 3, .round = round, .min_workers = 2, .max_workers = 8, .sampling = sampling};
        const bool keyed = k.kind == StrategyKind::kDpFedAvg && (sampling.fraction || sampling.count);
        if (keyed) continue;
        EXPECT_EQ((*made)->ConfigureRound(ctx, available), ChooseParticipants(ctx, available))
            << k.name << " round " << round;
      }
    }
    const RoundContext sampled{
        .job_seed = 3, .round = 1, .min_workers = 2, .max_workers = 8, .sampling = Sampling{.count = 4}};
    EXPECT_EQ((*made)->ConfigureRound(sampled, available).size(), 4u) << k.name;
  }
}

TEST(MakeStrategyTest, DefaultOptions) {
  EXPECT_EQ(StrategyKinds().size(), 11u);
  EXPECT_EQ(DefaultStrategyOptions(StrategyKind::kFedProx).mu, 0.01);
  EXPECT_EQ(DefaultStrategyOptions(StrategyKind::kFedYogi).tau, 1e-3);
}

std::vector<Candidate> Workers(int n) {
  std::vector<Candidate> out;
  for (int i = 0; i < n; ++i) out.push_back({.worker_id = 100 + i, .shard = i});
  return out;
}

std::set<int> Shards(const std::vector<ParticipantConfig>& chosen) {
  std::set<int> shards;
  for (const ParticipantConfig& p : chosen) shards.insert(p.shard);
  return shards;
}

TEST(SamplingTest, SampleCountIsSeededByJobAndRound) {
  const std::vector<Candidate> ten = Workers(10);
  RoundContext ctx{.job_seed = 42, .round = 1, .min_workers = 2, .max_workers = 10, .sampling = {.count = 3}};
  const auto first = ChooseParticipants(ctx, ten);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end(),
                             [](const ParticipantConfig& a, const ParticipantConfig& b) { return a.shard < b.shard; }));
  for (const ParticipantConfig& p : first) EXPECT_EQ(p.seed, TaskSeed(42, 1, p.shard));
  // The same job and round choose the same workers, whatever order they are offered in.
  std::vector<Candidate> reversed(ten.rbegin(), ten.rend());
  EXPECT_EQ(ChooseParticipants(ctx, reversed), first);
  // The chosen shards are the lowest SampleRanks.
  std::vector<std::pair<uint64_t, int>> ranks;
  for (int s = 0; s < 10; ++s) ranks.push_back({SampleRank(42, 1, s), s});
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(Shards(first), (std::set<int>{ranks[0].second, ranks[1].second, ranks[2].second}));
  // Other rounds (and other jobs) choose differently, and over rounds every shard takes part.
  std::set<std::set<int>> picks;
  std::set<int> seen;
  for (int round = 1; round <= 30; ++round) {
    ctx.round = round;
    const std::set<int> shards = Shards(ChooseParticipants(ctx, ten));
    picks.insert(shards);
    seen.insert(shards.begin(), shards.end());
  }
  EXPECT_GT(picks.size(), 5u);
  EXPECT_EQ(seen.size(), 10u);
  ctx.round = 1;
  ctx.job_seed = 43;
  EXPECT_NE(Shards(ChooseParticipants(ctx, ten)), Shards(first));
}

TEST(SamplingTest, FractionRoundsUpWithinMinAndMaxWorkers) {
  const std::vector<Candidate> ten = Workers(10);
  RoundContext ctx{.job_seed = 1, .round = 4, .min_workers = 2, .max_workers = 10, .sampling = {.fraction = 0.25}};
  EXPECT_EQ(ChooseParticipants(ctx, ten).size(), 3u);  // ceil(2.5)
  ctx.sampling.fraction = 0.01;
  EXPECT_EQ(ChooseParticipants(ctx, ten).size(), 2u);  // min_workers still holds
  ctx.sampling.fraction = 1.0;
  ctx.max_workers = 6;
  EXPECT_EQ(ChooseParticipants(ctx, ten).size(), 6u);  // at most max_workers
  ctx.sampling.fraction = 0.5;
  EXPECT_TRUE(ChooseParticipants(ctx, Workers(1)).empty());  // fewer than min_workers: keep waiting
  // A worker that becomes available displaces only workers that rank after it.
  ctx.sampling = {.count = 3};
  ctx.max_workers = 10;
  const std::set<int> of_nine = Shards(ChooseParticipants(ctx, Workers(9)));
  const std::set<int> of_ten = Shards(ChooseParticipants(ctx, ten));
  int kept = 0;
  for (int s : of_nine) kept += of_ten.count(s);
  EXPECT_GE(kept, of_ten.count(9) ? 2 : 3);
}

}  // namespace
}  // namespace parsyn::strategy
