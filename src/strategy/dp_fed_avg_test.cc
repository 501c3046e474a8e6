// dp_fedavg: clipping, noise, determinism and privacy accounting (strategy/dp_fed_avg.h, strategy/rdp_accountant.h),
// checked against tests/reference/dp_fedavg.py (NumPy, computed from the definitions).
#include "strategy/dp_fed_avg.h"
#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "strategy/aggregating_strategy_for_test.h"
#include "strategy/rdp_accountant.h"
#include "strategy/sampling.h"
#include "strategy/seed.h"
#include "weights/safetensors.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::WeightSet;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Two f32 tensors: a (2, 3) and b (5), so the model has an odd number of values (11).
WeightSet MakeElevenValueSet(const std::vector<float>& flat) {
  EXPECT_EQ(flat.size(), 11u);
  WeightSet set;
  EXPECT_TRUE(set.Add("a", DType::kF32, {2, 3}, std::as_bytes(std::span(flat).first(6))).ok());
  EXPECT_TRUE(set.Add("b", DType::kF32, {5}, std::as_bytes(std::span(flat).subspan(6))).ok());
  return set;
}

std::vector<float> FlatFloats(const WeightSet& set) {
  std::vector<float> out;
  for (const weights::Tensor& t : set.tensors()) {
    auto values = t.as<float>();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

std::vector<float> RandomValues(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-scale, scale);
  std::vector<float> out(n);
  for (float& x : out) x = value(rng);
  return out;
}

// A job's private key, as the coordinator keeps it: here 32 bytes of `fill`.
weights::SecretKey Key(unsigned char fill) {
  weights::SecretKey key;
  key.fill(fill);
  return key;
}

double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

StatusOr<WeightSet> OneRound(AggregatingStrategy<DpFedAvg>& dp, int round, const WeightSet& global,
                             const std::vector<WeightSet>& updates) {
  if (Status s = dp.Begin(round, global); !s.ok()) return s;
  for (const WeightSet& u : updates) {
    if (Status s = dp.Accept(u, 10); !s.ok()) return s;
  }
  StatusOr<WeightSet> next = dp.Finish();
  if (next.ok()) dp.CommitState();  // the round commits
  return next;
}

StatusOr<WeightSet> OneRound(AggregatingStrategy<DpFedAvg>& dp, int round, const WeightSet& global,
                             const WeightSet& update) {
  std::vector<WeightSet> updates;
  updates.push_back(update.Clone());
  return OneRound(dp, round, global, updates);
}

TEST(DpFedAvgTest, ClipsTheWholeUpdateToClipNormAndLeavesSmallerOnesAlone) {
  const DpFedAvgOptions options{.clip_norm = 0.5, .noise_multiplier = 0, .delta = 1e-5};
  const std::vector<float> g = RandomValues(11, 1, 1.0f);
  // ‖Δ‖ = 10·C, each tensor's part 5/√2: clipped per tensor, the result would have norm C·√2, not C.
  std::vector<double> d(11, 0.0);
  for (int i = 0; i < 6; ++i) d[i] = (i % 2 ? -3.0 : 3.0) / std::sqrt(6.0);
  for (int i = 6; i < 11; ++i) d[i] = 3.0 / std::sqrt(5.0);
  for (double& x : d) x *= 5.0 / std::sqrt(18.0);  // ‖d‖ = 5 = 10·C
  std::vector<float> u(11);
  for (int i = 0; i < 11; ++i) u[i] = static_cast<float>(g[i] + d[i]);

  AggregatingStrategy<DpFedAvg> dp(options, Key(7));
  StatusOr<WeightSet> result = OneRound(dp, 1, MakeElevenValueSet(g), MakeElevenValueSet(u));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::vector<float> got = FlatFloats(*result);
  std::vector<double> moved(11);
  for (int i = 0; i < 11; ++i) moved[i] = static_cast<double>(got[i]) - g[i];
  EXPECT_NEAR(Norm(moved), 0.5, 1e-5);  // scaled to C (float32 rounding of w and w + Δ)
  for (int i = 0; i < 11; ++i) EXPECT_NEAR(moved[i], d[i] / 10, 2e-6) << i;  // same direction
  ASSERT_TRUE(dp.last_round().has_value());
  EXPECT_EQ(dp.last_round()->clipped, 1);

  // Below the norm: unchanged. Values on a 2^-10 grid, so w - g and g + (w - g) are exact: the result is w's bits.
  std::vector<float> g2(11), small(11);
  for (int i = 0; i < 11; ++i) {
    g2[i] = static_cast<float>(i - 5) / 1024;
    small[i] = g2[i] + static_cast<float>((i % 3) - 1) * 40 / 1024;  // ‖Δ‖ = sqrt(7) · 40/1024 ≈ 0.103
  }
  result = OneRound(dp, 2, MakeElevenValueSet(g2), MakeElevenValueSet(small));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(FlatFloats(*result), small);
  EXPECT_EQ(dp.last_round()->clipped, 0);
}

TEST(DpFedAvgTest, AveragesUnweightedWhateverTheSampleCounts) {
  AggregatingStrategy<DpFedAvg> dp(DpFedAvgOptions{.clip_norm = 100, .noise_multiplier = 0, .delta = 1e-5}, Key(1));
  const std::vector<float> zero(11, 0.0f);
  ASSERT_TRUE(dp.Begin(1, MakeElevenValueSet(zero)).ok());
  ASSERT_TRUE(dp.Accept(MakeElevenValueSet(std::vector<float>(11, 1.0f)), 1000).ok());
  ASSERT_TRUE(dp.Accept(MakeElevenValueSet(std::vector<float>(11, -0.5f)), 1).ok());
  StatusOr<WeightSet> result = dp.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(FlatFloats(*result), std::vector<float>(11, 0.25f));
}

// Noise alone (every update equals the global): N(0, (σ·C/K)²) per coordinate over 2^20 coordinates.
TEST(DpFedAvgTest, NoiseHasZeroMeanAndTheExpectedStandardDeviation) {
  constexpr int64_t kN = int64_t{1} << 20;
  WeightSet global;
  ASSERT_TRUE(global.AddZeros("w", DType::kF32, {kN}).ok());
  AggregatingStrategy<DpFedAvg> dp(DpFedAvgOptions{.clip_norm = 0.5, .noise_multiplier = 2.0, .delta = 1e-5}, Key(42));
  ASSERT_TRUE(dp.Begin(1, global).ok());
  ASSERT_TRUE(dp.Accept(global, 1).ok());
  ASSERT_TRUE(dp.Accept(global, 1).ok());
  StatusOr<WeightSet> result = dp.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  const double expected_std = 2.0 * 0.5 / 2;  // σ·C/K
  EXPECT_EQ(dp.pending_round()->noise_stddev, expected_std);

  double sum = 0, sum_sq = 0;
  int64_t within_1 = 0, within_2 = 0;
  for (float v : (*result)[0].as<float>()) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    within_1 += std::abs(v) < expected_std;
    within_2 += std::abs(v) < 2 * expected_std;
  }
  const double mean = sum / kN;
  const double stddev = std::sqrt(sum_sq / kN - mean * mean);
  // Bounds of 5 standard errors (the seed is fixed, so this is deterministic; a wrong generator is far outside):
  // mean: std/sqrt(n) = 4.9e-4; std: std/sqrt(2n) = 3.5e-4; fractions: sqrt(p(1-p)/n) = 4.5e-4 and 2.0e-4.
  EXPECT_NEAR(mean, 0.0, 5 * expected_std / std::sqrt(kN));
  EXPECT_NEAR(stddev, expected_std, 5 * expected_std / std::sqrt(2.0 * kN));
  EXPECT_NEAR(static_cast<double>(within_1) / kN, 0.6826894921, 5 * 4.6e-4);
  EXPECT_NEAR(static_cast<double>(within_2) / kN, 0.9544997361, 5 * 2.1e-4);
}

TEST(DpFedAvgTest, SameKeyAndRoundGiveIdenticalBitsWhateverTheArrivalOrder) {
  const DpFedAvgOptions options{.clip_norm = 1.0, .noise_multiplier = 1.1, .delta = 1e-5};
  const WeightSet global = MakeElevenValueSet(RandomValues(11, 3, 1.0f));
  std::vector<WeightSet> updates, reversed;
  for (uint32_t i = 0; i < 5; ++i) updates.push_back(MakeElevenValueSet(RandomValues(11, 10 + i, 2.0f)));
  for (int i = 4; i >= 0; --i) reversed.push_back(updates[i].Clone());

  AggregatingStrategy<DpFedAvg> first(options, Key(99)), resumed(options, Key(99)), other_job(options, Key(100));
  StatusOr<WeightSet> a = OneRound(first, 4, global, updates);
  StatusOr<WeightSet> b = OneRound(resumed, 4, global, reversed);  // a fresh strategy, as after a restart
  StatusOr<WeightSet> next_round = OneRound(first, 5, global, updates);
  StatusOr<WeightSet> c = OneRound(other_job, 4, global, updates);
  ASSERT_TRUE(a.ok() && b.ok() && next_round.ok() && c.ok());
  for (size_t k = 0; k < a->size(); ++k) {
    ASSERT_EQ(std::memcmp((*a)[k].data.data(), (*b)[k].data.data(), (*a)[k].data.size()), 0) << (*a)[k].name;
  }
  // Another round or another job's key draws other noise: every coordinate differs.
  const std::vector<float> fa = FlatFloats(*a), fn = FlatFloats(*next_round), fc = FlatFloats(*c);
  for (size_t i = 0; i < fa.size(); ++i) {
    EXPECT_NE(fa[i], fn[i]) << i;
    EXPECT_NE(fa[i], fc[i]) << i;
  }
}

// The attack the private key defeats: whoever reads a job's spec knows its config.seed (42 by default). Were the noise
// drawn from that seed (as it once was: SplitMix64 seeded with Mix64(Mix64(seed ^ "dp_noise") + round), Box-Muller),
// the attacker would regenerate it exactly and subtract it from the released global, leaving the noise-free average
// and voiding every ε. Drawn under the private key, the regenerated noise is unrelated: what is left after
// subtracting it is no closer to the average than the release itself.
TEST(DpFedAvgTest, NoiseCannotBeRegeneratedFromTheJobSpec) {
  constexpr uint64_t kSpecSeed = 42;  // config.seed, in the job spec for every admin to read
  constexpr int kRound = 1;
  constexpr int64_t kN = 4096;
  const DpFedAvgOptions options{.clip_norm = 1.0, .noise_multiplier = 1.0, .delta = 1e-5};
  WeightSet global;
  ASSERT_TRUE(global.AddZeros("w", DType::kF32, {kN}).ok());
  AggregatingStrategy<DpFedAvg> dp(options, Key(0x5a));
  ASSERT_TRUE(dp.Begin(kRound, global).ok());
  ASSERT_TRUE(dp.Accept(global, 1).ok());  // a zero delta: the noise-free average is exactly the global (0)
  StatusOr<WeightSet> released = dp.Finish();
  ASSERT_TRUE(released.ok()) << released.status().ToString();

  // The attacker's regeneration from the spec.
  auto word = [seed = Mix64(Mix64(kSpecSeed ^ 0x64705f6e6f697365ULL) + kRound)](uint64_t k) {
    return Mix64(seed + k * 0x9e3779b97f4a7c15ULL);
  };
  const double stddev = options.noise_multiplier * options.clip_norm;  // K = 1
  double residual = 0, release = 0;
  const std::span<const float> values = (*released)[0].as<float>();
  for (int64_t i = 0; i < kN; ++i) {
    const uint64_t p = static_cast<uint64_t>(i / 2);
    const double u1 = static_cast<double>((word(2 * p) >> 11) + 1) * 0x1p-53;
    const double u2 = static_cast<double>(word(2 * p + 1) >> 11) * 0x1p-53;
    const double angle = 2 * std::numbers::pi * u2;
    const double z = std::sqrt(-2 * std::log(u1)) * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
    const double cleaned = values[i] - stddev * z;
    residual += cleaned * cleaned;
    release += static_cast<double>(values[i]) * values[i];
  }
  // With the seed's noise the residual would be ~0 (float rounding); independent noise doubles its energy instead.
  EXPECT_GT(std::sqrt(residual / kN), 0.5 * stddev);
  EXPECT_GT(residual, release);
}

// The client sample is drawn under the key too: ranking the shards by the spec's seed (what sampling without DP does)
// does not predict which workers a dp_fedavg round takes, so the accountant's amplification by sampling (q < 1) holds.
TEST(DpFedAvgTest, SampleCannotBePredictedFromTheJobSpec) {
  std::vector<Candidate> available;
  for (int64_t w = 1; w <= 20; ++w) available.push_back({.worker_id = w, .shard = static_cast<int>(w - 1)});
  AggregatingStrategy<DpFedAvg> dp(DpFedAvgOptions{.clip_norm = 1.0, .noise_multiplier = 1.0, .delta = 1e-5},
                                   Key(0x33));
  AggregatingStrategy<DpFedAvg> same_key(DpFedAvgOptions{.clip_norm = 1.0, .noise_multiplier = 1.0, .delta = 1e-5},
                                         Key(0x33));
  int differing_rounds = 0;
  for (int round = 1; round <= 10; ++round) {
    RoundContext ctx;
    ctx.round = round;
    ctx.job_seed = 42;
    ctx.min_workers = 1;
    ctx.max_workers = 20;
    ctx.sampling.count = 5;
    auto ids = [](const std::vector<ParticipantConfig>& ps) {
      std::vector<int64_t> out;
      for (const ParticipantConfig& p : ps) out.push_back(p.worker_id);
      return out;
    };
    const std::vector<int64_t> drawn = ids(dp.ConfigureRound(ctx, available));
    EXPECT_EQ(drawn.size(), 5u);
    EXPECT_EQ(drawn, ids(same_key.ConfigureRound(ctx, available)));  // a resumed job draws the same sample
    differing_rounds += drawn != ids(ChooseParticipants(ctx, available));
  }
  EXPECT_GE(differing_rounds, 8);  // with 5 of 20, two independent draws agree with probability 1 / C(20, 5)
}

TEST(DpFedAvgTest, KeepsTheGlobalsDtypeAndRejectsBadInput) {
  // bf16 global: the result is bf16, the clipped mean is computed in float32.
  WeightSet bf16;
  std::vector<uint16_t> values(4, weights::FloatToBf16(1.0f));
  ASSERT_TRUE(bf16.Add("w", DType::kBF16, {4}, std::as_bytes(std::span(values))).ok());
  WeightSet bf16_update = bf16.Clone();
  for (uint16_t& v : bf16_update[0].as<uint16_t>()) v = weights::FloatToBf16(1.25f);
  AggregatingStrategy<DpFedAvg> dp(DpFedAvgOptions{.clip_norm = 10, .noise_multiplier = 0, .delta = 1e-5}, Key(1));
  EXPECT_EQ(dp.Accept(bf16_update, 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dp.Begin(1, bf16).ok());
  EXPECT_EQ(dp.Accept(bf16_update, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dp.Accept(MakeElevenValueSet(std::vector<float>(11, 0.0f)), 1).code(), StatusCode::kInvalidArgument);
  WeightSet with_nan = bf16.Clone();
  with_nan[0].as<uint16_t>()[2] = weights::FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(dp.Accept(with_nan, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dp.num_accepted(), 0);
  EXPECT_EQ(dp.Finish().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dp.Begin(1, bf16).ok());
  ASSERT_TRUE(dp.Accept(bf16_update, 1).ok());
  StatusOr<WeightSet> result = dp.Finish();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ((*result)[0].dtype, DType::kBF16);
  for (uint16_t v : (*result)[0].as<uint16_t>()) EXPECT_EQ(weights::Bf16ToFloat(v), 1.25f);

  WeightSet ints;
  ASSERT_TRUE(ints.AddZeros("steps", DType::kI64, {1}).ok());
  EXPECT_EQ(dp.Begin(2, ints).code(), StatusCode::kInvalidArgument);

  EXPECT_TRUE(ValidateDpFedAvgOptions({}).ok());
  const Status no_clip = ValidateDpFedAvgOptions(DpFedAvgOptions{.clip_norm = 0});
  EXPECT_NE(no_clip.ToString().find("clip_norm"), std::string::npos) << no_clip.ToString();
  const Status negative_noise = ValidateDpFedAvgOptions({.noise_multiplier = -1});
  EXPECT_NE(negative_noise.ToString().find("noise_multiplier"), std::string::npos) << negative_noise.ToString();
  const Status bad_delta = ValidateDpFedAvgOptions({.delta = 1});
  EXPECT_NE(bad_delta.ToString().find("delta"), std::string::npos) << bad_delta.ToString();
  EXPECT_FALSE(ValidateDpFedAvgOptions(DpFedAvgOptions{.clip_norm = std::numeric_limits<double>::infinity()}).ok());
}

// ε after each round is the accountant's for the rounds so far, with q = K / eligible; a restarted strategy that
// replays the recorded rounds reports the same ε bit for bit.
// Distributed DP (secure aggregation): the mean handed to FinishFromMean is the workers' clipped, noisy deltas' mean;
// the strategy adds nothing to it and accounts the round as if it had added the noise.
TEST(DpFedAvgTest, WithNoiseFromTheWorkersTheMeanIsTakenAsItIsAndAccountedTheSame) {
  const DpFedAvgOptions central{.clip_norm = 1.0, .noise_multiplier = 1.0, .delta = 1e-5};
  DpFedAvgOptions distributed = central;
  distributed.noise_from_workers = true;
  const WeightSet global = MakeElevenValueSet(RandomValues(11, 3, 1.0f));
  const WeightSet mean_delta = MakeElevenValueSet(RandomValues(11, 4, 0.1f));
  DpFedAvg with_workers_noise(distributed, Key(5)), with_own_noise(central, Key(5));
  for (DpFedAvg* dp : {&with_workers_noise, &with_own_noise}) {
    dp->set_eligible_workers(40);
    ASSERT_TRUE(dp->BeginRound(1, global).ok());
  }
  StatusOr<WeightSet> next = with_workers_noise.FinishFromMean(mean_delta.Clone(), 4);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  const std::vector<float> g = FlatFloats(global), d = FlatFloats(mean_delta), n = FlatFloats(*next);
  for (size_t i = 0; i < n.size(); ++i) EXPECT_EQ(n[i], g[i] + d[i]) << i;
  StatusOr<WeightSet> noisy = with_own_noise.FinishFromMean(mean_delta.Clone(), 4);
  ASSERT_TRUE(noisy.ok()) << noisy.status().ToString();
  EXPECT_NE(FlatFloats(*noisy), n);  // the central strategy adds its noise: the check above bites
  EXPECT_EQ(with_workers_noise.pending_round()->epsilon, with_own_noise.pending_round()->epsilon);
  EXPECT_EQ(with_workers_noise.pending_round()->epsilon, EpsilonAfter(1, 0.1, 1.0, 1e-5));
}

TEST(DpFedAvgTest, ReportsEpsilonSpentAfterEachRound) {
  const DpFedAvgOptions options{.clip_norm = 1.0, .noise_multiplier = 1.0, .delta = 1e-5};
  const WeightSet global = MakeElevenValueSet(std::vector<float>(11, 0.0f));
  std::vector<WeightSet> updates;
  for (uint32_t i = 0; i < 4; ++i) updates.push_back(MakeElevenValueSet(RandomValues(11, 20 + i, 1.0f)));
  AggregatingStrategy<DpFedAvg> dp(options, Key(5));
  EXPECT_EQ(dp.epsilon_spent(), 0.0);
  dp.set_eligible_workers(40);
  ASSERT_TRUE(OneRound(dp, 1, global, updates).ok());
  EXPECT_EQ(dp.last_round()->sampling_rate, 0.1);
  EXPECT_EQ(dp.epsilon_spent(), EpsilonAfter(1, 0.1, 1.0, 1e-5));
  ASSERT_TRUE(OneRound(dp, 2, global, updates).ok());
  ASSERT_TRUE(OneRound(dp, 3, global, updates).ok());
  const double after_three = dp.epsilon_spent();
  EXPECT_EQ(after_three, EpsilonAfter(3, 0.1, 1.0, 1e-5));
  EXPECT_GT(after_three, EpsilonAfter(2, 0.1, 1.0, 1e-5));
  EXPECT_EQ(dp.last_round()->epsilon, after_three);
  EXPECT_EQ(dp.accountant().rounds(), 3);

  AggregatingStrategy<DpFedAvg> restarted(options, Key(5));
  for (int r = 0; r < 3; ++r) restarted.RecordPastRound(4, 40);
  EXPECT_EQ(restarted.epsilon_spent(), after_three);

  // Unknown eligible count: q = 1, the plain Gaussian mechanism. No noise: no privacy.
  AggregatingStrategy<DpFedAvg> unknown(options, Key(5));
  ASSERT_TRUE(OneRound(unknown, 1, global, updates).ok());
  EXPECT_EQ(unknown.last_round()->sampling_rate, 1.0);
  EXPECT_EQ(unknown.epsilon_spent(), EpsilonAfter(1, 1.0, 1.0, 1e-5));
  AggregatingStrategy<DpFedAvg> no_noise(DpFedAvgOptions{.clip_norm = 1.0, .noise_multiplier = 0, .delta = 1e-5},
                                         Key(5));
  ASSERT_TRUE(OneRound(no_noise, 1, global, updates).ok());
  EXPECT_EQ(no_noise.epsilon_spent(), kInf);
}

// The accountant advances only when a round commits: a round that fails after Finish (not committed) and is retried
// counts once; the state stored with a committed round restores the same accountant, ε and report bit for bit.
TEST(DpFedAvgTest, AccountsOnlyCommittedRoundsAndRestoresTheStateExactly) {
  const DpFedAvgOptions options{.clip_norm = 1.0, .noise_multiplier = 1.1, .delta = 1e-5};
  const WeightSet global = MakeElevenValueSet(std::vector<float>(11, 0.0f));
  std::vector<WeightSet> updates;
  for (uint32_t i = 0; i < 3; ++i) updates.push_back(MakeElevenValueSet(RandomValues(11, 40 + i, 1.0f)));
  AggregatingStrategy<DpFedAvg> dp(options, Key(9));
  dp.set_eligible_workers(30);
  ASSERT_TRUE(dp.has_state());
  EXPECT_EQ(dp.PendingState(), nullptr);
  ASSERT_TRUE(OneRound(dp, 1, global, updates).ok());  // committed
  const double after_one = dp.epsilon_spent();
  EXPECT_EQ(after_one, EpsilonAfter(1, 0.1, 1.1, 1e-5));

  // Round 2 finishes but does not commit: ε is still round 1's; the pending report says what round 2 would add.
  ASSERT_TRUE(dp.Begin(2, global).ok());
  for (const WeightSet& u : updates) ASSERT_TRUE(dp.Accept(u, 1).ok());
  StatusOr<WeightSet> failed = dp.Finish();
  ASSERT_TRUE(failed.ok());
  ASSERT_NE(dp.PendingState(), nullptr);
  EXPECT_EQ(dp.epsilon_spent(), after_one);
  EXPECT_EQ(dp.pending_round()->epsilon, EpsilonAfter(2, 0.1, 1.1, 1e-5));
  EXPECT_EQ(dp.accountant().rounds(), 1);
  // The retry (Begin again) drops the pending round; after its commit two rounds count, not three.
  StatusOr<WeightSet> retried = OneRound(dp, 2, global, updates);
  ASSERT_TRUE(retried.ok());
  EXPECT_EQ(weights::SerializeSafetensors(*retried), weights::SerializeSafetensors(*failed));  // same noise seed
  EXPECT_EQ(dp.accountant().rounds(), 2);
  EXPECT_EQ(dp.epsilon_spent(), EpsilonAfter(2, 0.1, 1.1, 1e-5));
  EXPECT_FALSE(dp.pending_round().has_value());

  // Round 3: its pending state, serialised as the job runner stores it, restores a fresh strategy exactly.
  ASSERT_TRUE(dp.Begin(3, global).ok());
  for (const WeightSet& u : updates) ASSERT_TRUE(dp.Accept(u, 1).ok());
  ASSERT_TRUE(dp.Finish().ok());
  ASSERT_NE(dp.PendingState(), nullptr);
  const std::vector<std::byte> stored = weights::SerializeSafetensors(*dp.PendingState());
  dp.CommitState();
  StatusOr<WeightSet> parsed = weights::ParseSafetensors(stored);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  AggregatingStrategy<DpFedAvg> restarted(options, Key(9));
  ASSERT_TRUE(restarted.RestoreState(&*parsed).ok());
  EXPECT_EQ(restarted.accountant().rdp(), dp.accountant().rdp());
  EXPECT_EQ(restarted.accountant().rounds(), 3);
  EXPECT_EQ(restarted.epsilon_spent(), dp.epsilon_spent());
  ASSERT_TRUE(restarted.last_round().has_value());
  EXPECT_EQ(restarted.last_round()->round, 3);
  EXPECT_EQ(restarted.last_round()->participants, 3);
  EXPECT_EQ(restarted.last_round()->sampling_rate, 0.1);
  EXPECT_EQ(restarted.last_round()->noise_stddev, dp.last_round()->noise_stddev);
  EXPECT_EQ(restarted.last_round()->epsilon, dp.epsilon_spent());
  // Both go on identically: same global bits, same ε.
  restarted.set_eligible_workers(30);
  StatusOr<WeightSet> a = OneRound(dp, 4, global, updates);
  StatusOr<WeightSet> b = OneRound(restarted, 4, global, updates);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(weights::SerializeSafetensors(*a), weights::SerializeSafetensors(*b));
  EXPECT_EQ(restarted.epsilon_spent(), dp.epsilon_spent());
  EXPECT_EQ(dp.epsilon_spent(), EpsilonAfter(4, 0.1, 1.1, 1e-5));

  // No state: the initial accountant. Another strategy's state: refused.
  ASSERT_TRUE(restarted.RestoreState(nullptr).ok());
  EXPECT_EQ(restarted.epsilon_spent(), 0.0);
  EXPECT_EQ(restarted.accountant().rounds(), 0);
  WeightSet foreign = parsed->Clone();
  foreign.metadata()["strategy"] = "fedadam";
  EXPECT_EQ(restarted.RestoreState(&foreign).code(), StatusCode::kInvalidArgument);
}

TEST(RdpAccountantTest, PlainGaussianIsExact) {
  for (double sigma : {0.5, 1.0, 3.7}) {
    for (double order : DefaultRdpOrders()) {
      EXPECT_EQ(SampledGaussianRdp(1.0, sigma, order), order / (2 * sigma * sigma)) << sigma << " " << order;
    }
  }
  // ε = min over α of T·α/(2σ²) - log(δ)/(α-1) (classic), here over the default orders.
  double expected = kInf;
  for (double a : DefaultRdpOrders()) expected = std::min(expected, 10 * a / (2 * 4.0) - std::log(1e-5) / (a - 1));
  EXPECT_EQ(EpsilonAfter(10, 1.0, 2.0, 1e-5, DpConversion::kClassic), expected);
  EXPECT_EQ(SampledGaussianRdp(0.0, 1.0, 2.0), 0.0);
  EXPECT_EQ(SampledGaussianRdp(0.5, 0.0, 2.0), kInf);
  EXPECT_TRUE(std::isnan(SampledGaussianRdp(1.5, 1.0, 2.0)));
  EXPECT_TRUE(std::isnan(EpsilonAfter(1, 0.5, 1.0, 0.0)));
}

// TF-Privacy's MNIST tutorial (tutorials/README.md): 60000 examples, batches of 256, noise multiplier 1.12, 60 epochs
// (14062 steps), δ = 1e-5: "privacy eps 2.92", computed there with orders 1.1, 1.2, ..., 10.9, 12, ..., 63 and the
// classic conversion. The printed value is rounded to 2 decimals: tolerance 0.005.
TEST(RdpAccountantTest, MatchesTfPrivacysPublishedMnistEpsilon) {
  std::vector<double> tf_orders;
  for (int x = 1; x < 100; ++x) tf_orders.push_back(1 + x / 10.0);
  for (int o = 12; o < 64; ++o) tf_orders.push_back(o);
  RdpAccountant accountant(tf_orders);
  accountant.AddRounds(256.0 / 60000, 1.12, 14062);
  const EpsilonAtOrder classic = accountant.Epsilon(1e-5, DpConversion::kClassic);
  std::printf("[ tf mnist ] classic eps %.4f at order %g; improved %.4f; default orders classic %.4f improved %.4f\n",
              classic.epsilon, classic.order, accountant.Epsilon(1e-5).epsilon,
              EpsilonAfter(14062, 256.0 / 60000, 1.12, 1e-5, DpConversion::kClassic),
              EpsilonAfter(14062, 256.0 / 60000, 1.12, 1e-5));
  EXPECT_NEAR(classic.epsilon, 2.92, 0.005);
  EXPECT_LT(accountant.Epsilon(1e-5).epsilon, classic.epsilon);

  // Incremental accounting equals the closed count.
  RdpAccountant step_by_step;
  for (int r = 0; r < 50; ++r) step_by_step.AddRounds(0.05, 0.9);
  EXPECT_NEAR(step_by_step.Epsilon(1e-6).epsilon, EpsilonAfter(50, 0.05, 0.9, 1e-6), 1e-12);
}

// The accountant and the aggregate against tests/reference/dp_fedavg.py on a table of cases.
TEST(DpFedAvgTest, MatchesIndependentNumpyReference) {
  struct Case {
    double q, sigma;
    int64_t rounds;
    double delta;
  };
  const std::vector<Case> cases = {
      {256.0 / 60000, 1.12, 14062, 1e-5},
      {0.01, 1.0, 1000, 1e-5},
      {0.1, 0.8, 100, 1e-6},
      {0.5, 2.0, 50, 1e-5},
      {1.0, 1.5, 10, 1e-5},
      {0.02, 4.0, 5000, 1e-7},
      {0.3, 0.5, 20, 1e-3},
      {0.001, 1.0, 100000, 1e-5},
  };
  const weights::SecretKey key =
      *weights::ParseSecretKey("00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210");
  const DpFedAvgOptions options{.clip_norm = 1.5, .noise_multiplier = 0.7, .delta = 1e-5};
  const std::vector<float> global = RandomValues(11, 30, 0.3f);
  std::vector<std::vector<float>> updates;
  for (uint32_t i = 0; i < 4; ++i) updates.push_back(RandomValues(11, 40 + i, i % 2 ? 0.2f : 3.0f));  // some clip

  test_support::TempDir dir("dp_fedavg");
  const auto input = dir.path() / "input.txt";
  const auto output = dir.path() / "output.txt";
  {
    std::ofstream in(input);
    in.precision(17);
    in << "orders";
    for (double a : DefaultRdpOrders()) in << " " << a;
    in << "\n";
    for (const Case& c : cases) in << "case " << c.q << " " << c.sigma << " " << c.rounds << " " << c.delta << "\n";
    in << "aggregate 00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210 3 " << options.clip_norm << " "
       << options.noise_multiplier << "\nglobal";
    for (float v : global) in << " " << v;
    for (const auto& u : updates) {
      in << "\nupdate";
      for (float v : u) in << " " << v;
    }
    in << "\nend\n";
  }
  const std::string command = "/usr/bin/python3 " + test_support::SourcePath("tests/reference/dp_fedavg.py") + " " +
                              input.string() + " " + output.string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream out(output);
  std::string line;

  for (const Case& c : cases) {
    SCOPED_TRACE("q=" + std::to_string(c.q) + " sigma=" + std::to_string(c.sigma));
    ASSERT_TRUE(std::getline(out, line));
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    ASSERT_EQ(tag, "case");
    const std::span<const double> orders = DefaultRdpOrders();
    std::vector<double> reference(orders.size() + 2);
    for (double& v : reference) fields >> v;
    ASSERT_TRUE(fields) << line;
    // Per order: within 1e-9 relative (the reference integrates numerically; ours sums series).
    for (size_t k = 0; k < orders.size(); ++k) {
      const double ours = SampledGaussianRdp(c.q, c.sigma, orders[k]);
      EXPECT_NEAR(ours, reference[k], 1e-9 * reference[k] + 1e-14) << "order " << orders[k];
    }
    const double classic = EpsilonAfter(c.rounds, c.q, c.sigma, c.delta, DpConversion::kClassic);
    const double improved = EpsilonAfter(c.rounds, c.q, c.sigma, c.delta, DpConversion::kImproved);
    EXPECT_NEAR(classic, reference[orders.size()], 1e-9 * classic);
    EXPECT_NEAR(improved, reference[orders.size() + 1], 1e-9 * improved);
    std::printf("[ epsilon  ] q=%-9.6g sigma=%-4g rounds=%-6lld delta=%-6g classic %-9.5f improved %.5f\n", c.q,
                c.sigma, static_cast<long long>(c.rounds), c.delta, classic, improved);
  }

  ASSERT_TRUE(std::getline(out, line));
  std::istringstream fields(line);
  std::string tag;
  fields >> tag;
  ASSERT_EQ(tag, "aggregate");
  std::vector<double> reference(11);
  for (double& v : reference) fields >> v;
  ASSERT_TRUE(fields) << line;
  AggregatingStrategy<DpFedAvg> dp(options, key);
  std::vector<WeightSet> update_sets;
  for (const auto& u : updates) update_sets.push_back(MakeElevenValueSet(u));
  StatusOr<WeightSet> result = OneRound(dp, 3, MakeElevenValueSet(global), update_sets);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(dp.last_round()->clipped, 2);
  const std::vector<float> got = FlatFloats(*result);
  // float32 result and float32 clipped deltas against float64: a few float32 ulps of O(1) values.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], reference[i], 1e-6 * (1 + std::abs(reference[i]))) << i;
}

}  // namespace
}  // namespace parsyn::strategy
