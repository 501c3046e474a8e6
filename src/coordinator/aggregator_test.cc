#include "coordinator/aggregator.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "base/sha256.h"
#include "coordinator/job_runner_internal.h"
#include "storage/local_blob_copy.h"
#include "storage/memory_blob_store.h"
#include "strategy/strategy_options.h"

namespace parsyn::coordinator {
namespace {

constexpr char kGlobalKey[] = "jobs/1/rounds/000001-a1/global.safetensors";
constexpr char kStateKey[] = "jobs/1/rounds/000001-a1/server_state.safetensors";
// The global round 1 starts from, as the base of a delta (its sha256 is only passed along).
constexpr char kInitialKey[] = "jobs/1/rounds/000000/global.safetensors";
const std::string kInitialSha(64, 'c');

// A spool folder for the downlink's files, shared by the tests of this binary.
std::filesystem::path Spool() { return std::filesystem::temp_directory_path() / "parsyn-aggregator-test-spool"; }

storage::TrainingJob JobWithId(int64_t id) {
  storage::TrainingJob job;
  job.id = id;
  return job;
}

JobSpec SpecOf(strategy::StrategyKind kind) {
  JobSpec spec;
  spec.distributed.strategy = kind;
  spec.distributed.strategy_options = strategy::DefaultStrategyOptions(kind);
  return spec;
}

weights::WeightSet OneValue(float value) {
  weights::WeightSet set;
  const std::array<float, 1> values{value};
  EXPECT_TRUE(set.Add("w", weights::DType::kF32, {1}, std::as_bytes(std::span(values))).ok());
  return set;
}

float ValueOf(const weights::WeightSet& set) {
  float value = 0;
  std::memcpy(&value, set.Find("w")->data.data(), sizeof value);
  return value;
}

TEST(AggregatorTest, MakesTheSpecsStrategyOrSaysWhyNot) {
  const storage::TrainingJob job = JobWithId(7);
  Aggregator fed_avg(job, SpecOf(strategy::StrategyKind::kFederatedAveraging), 4);
  ASSERT_NE(fed_avg.strategy(), nullptr);
  EXPECT_EQ(fed_avg.strategy()->name(), "federated_averaging");
  EXPECT_TRUE(fed_avg.error().ok());

  // dp_fedavg draws its noise under the job's private seed: without one it is not made.
  Aggregator no_seed(job, SpecOf(strategy::StrategyKind::kDpFedAvg), 4);
  EXPECT_EQ(no_seed.strategy(), nullptr);
  EXPECT_EQ(no_seed.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(no_seed.error().message().find("job 7 has no private seed"), std::string::npos);

  storage::TrainingJob seeded = job;
  seeded.private_seed = std::string(64, 'a');
  JobSpec dp = SpecOf(strategy::StrategyKind::kDpFedAvg);
  dp.distributed.strategy_options.clip_norm = 1.0;
  Aggregator dp_fed_avg(seeded, dp, 4);
  ASSERT_NE(dp_fed_avg.strategy(), nullptr);
  EXPECT_EQ(dp_fed_avg.strategy()->name(), "dp_fedavg");
}

TEST(AggregatorTest, FinishRoundStoresTheMeanAsTheNewGlobal) {
  Aggregator aggregator(JobWithId(1), SpecOf(strategy::StrategyKind::kFederatedAveraging), 2);
  const weights::WeightSet initial = OneValue(0);
  ASSERT_TRUE(aggregator.Begin(1, initial).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(1), 1, std::nullopt).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(3), 3, std::nullopt).ok());
  storage::MemoryBlobStore blobs;
  Aggregator::FinishTimings timings;
  const Aggregator::Base base{.key = kInitialKey, .sha256 = kInitialSha, .weights = initial};
  StatusOr<Aggregator::Aggregated> aggregated =
      aggregator.FinishRound(blobs, kGlobalKey, kStateKey, base, Spool(), &timings);
  ASSERT_TRUE(aggregated.ok()) << aggregated.status().ToString();
  EXPECT_EQ(ValueOf(*aggregated->weights), 2.5f);  // (1 * 1 + 3 * 3) / 4
  EXPECT_EQ(aggregated->weights->metadata().at("format"), "pt");
  EXPECT_FALSE(aggregated->weights->metadata().contains(kServerStateShaKey));  // FedAvg keeps no state
  StatusOr<storage::BlobInfo> stored = blobs.Head(kGlobalKey);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->sha256, aggregated->info.sha256);
  EXPECT_EQ(blobs.Head(kStateKey).status().code(), StatusCode::kNotFound);
  EXPECT_GE(timings.finish_ms, 0);
  EXPECT_GE(timings.put_ms, 0);

  // Nothing accepted since Begin: no global, nothing stored.
  ASSERT_TRUE(aggregator.Begin(2, OneValue(0)).ok());
  storage::MemoryBlobStore empty;
  EXPECT_EQ(aggregator.FinishRound(empty, kGlobalKey, kStateKey, base, Spool(), &timings).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(empty.Head(kGlobalKey).status().code(), StatusCode::kNotFound);
}

TEST(AggregatorTest, AStatefulStrategysStateIsStoredAndNamedByTheGlobal) {
  Aggregator aggregator(JobWithId(1), SpecOf(strategy::StrategyKind::kFedAdam), 2);
  ASSERT_TRUE(aggregator.strategy()->has_state());
  const weights::WeightSet initial = OneValue(0);
  ASSERT_TRUE(aggregator.Begin(1, initial).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(1), 1, std::nullopt).ok());
  storage::MemoryBlobStore blobs;
  Aggregator::FinishTimings timings;
  const Aggregator::Base base{.key = kInitialKey, .sha256 = kInitialSha, .weights = initial};
  StatusOr<Aggregator::Aggregated> aggregated =
      aggregator.FinishRound(blobs, kGlobalKey, kStateKey, base, Spool(), &timings);
  ASSERT_TRUE(aggregated.ok()) << aggregated.status().ToString();
  StatusOr<storage::BlobInfo> state = blobs.Head(kStateKey);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(aggregated->weights->metadata().at(kServerStateShaKey), state->sha256);
}

// 256 values of one tensor "w", drawn from `seed`.
weights::WeightSet RandomValues(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> values(256);
  for (float& v : values) v = normal(rng);
  weights::WeightSet set;
  EXPECT_TRUE(set.Add("w", weights::DType::kF32, {16, 16}, std::as_bytes(std::span(values))).ok());
  return set;
}

// With distributed.compression.global, the new global is what its delta decodes to, bit for bit as a worker writes
// it (WriteGlobalFromDelta over the stored delta), and the residual each round leaves is stored, named by the global,
// and carried into the next round's delta. Each round every worker uploads the global it got plus one fixed step:
// without error feedback int4's rounding of that step would pile up round after round; with it the third global is
// as close to three exact steps as the first is to one.
TEST(AggregatorTest, WithGlobalDeltasTheGlobalIsWhatTheDeltaDecodesToAndTheResidualCarriesOver) {
  JobSpec spec = SpecOf(strategy::StrategyKind::kFederatedAveraging);
  spec.distributed.compression.global = "delta_int4";
  Aggregator aggregator(JobWithId(1), spec, 2);
  storage::MemoryBlobStore blobs;
  Aggregator::FinishTimings timings;
  const std::filesystem::path spool = Spool() / "deltas";
  std::filesystem::create_directories(spool);
  const weights::WeightSet initial = RandomValues(1);
  const weights::WeightSet step = RandomValues(2);
  auto plus_step = [&](const weights::WeightSet& base) {
    weights::WeightSet out = base.Clone();
    for (int64_t i = 0; i < 256; ++i) {
      weights::StoreElement(out[0], i, weights::LoadElement(base[0], i) + weights::LoadElement(step[0], i));
    }
    return out;
  };

  auto round = [&](int r, const std::string& base_key, const weights::WeightSet& base) {
    EXPECT_TRUE(aggregator.Begin(r, base).ok());
    EXPECT_TRUE(aggregator.AcceptOwned(plus_step(base), 1, std::nullopt).ok());
    const std::string key = "jobs/1/rounds/00000" + std::to_string(r) + "-a1/global.safetensors";
    const Aggregator::Base from{.key = base_key, .sha256 = std::string(64, 'a' + r), .weights = base};
    StatusOr<Aggregator::Aggregated> aggregated = aggregator.FinishRound(blobs, key, "state", from, spool, &timings);
    EXPECT_TRUE(aggregated.ok()) << aggregated.status().ToString();
    return std::pair(key, *std::move(aggregated));
  };
  auto worker_sha = [&](const Aggregator::Aggregated& a, const weights::WeightSet& base) {
    const std::filesystem::path global = spool / "worker.safetensors";
    StatusOr<storage::LocalBlobCopy> delta = storage::LocalBlobCopy::Open(blobs, a.delta->key, spool);
    EXPECT_TRUE(delta.ok());
    const weights::WireEncoding encoding{.codec = weights::UpdateCodec::kInt4, .delta = true, .error_feedback = true};
    EXPECT_TRUE(weights::WriteGlobalFromDelta(delta->path(), base, encoding, a.delta->metadata, global).ok());
    StatusOr<std::string> sha = Sha256File(global);
    return sha.ok() ? *sha : sha.status().ToString();
  };
  // Squared distance from initial + steps * step.
  auto error = [&](const weights::WeightSet& set, int steps) {
    double sum = 0;
    for (int64_t i = 0; i < 256; ++i) {
      const double d = weights::LoadElement(set[0], i) - weights::LoadElement(initial[0], i) -
                       steps * weights::LoadElement(step[0], i);
      sum += d * d;
    }
    return sum;
  };

  auto [key1, first] = round(1, kInitialKey, initial);
  ASSERT_TRUE(first.delta.has_value());
  EXPECT_EQ(first.delta->of_global, key1);
  EXPECT_EQ(first.delta->base_sha256, std::string(64, 'b'));
  EXPECT_EQ(first.delta->sha256, blobs.Head(first.delta->key)->sha256);
  EXPECT_EQ(worker_sha(first, initial), first.info.sha256);
  const std::string residual_sha = first.weights->metadata().at("parsyn_global_residual_sha256");
  EXPECT_EQ(blobs.Head("jobs/1/rounds/000001-a1/global_residual.safetensors")->sha256, residual_sha);
  EXPECT_EQ(first.delta->metadata.at("parsyn_global_residual_sha256"), residual_sha);
  EXPECT_EQ(first.weights->metadata().at("format"), "pt");
  EXPECT_GT(error(*first.weights, 1), 0);  // int4 rounds the step

  auto [key2, second] = round(2, key1, *first.weights);
  EXPECT_EQ(worker_sha(second, *first.weights), second.info.sha256);
  auto [key3, third] = round(3, key2, *second.weights);
  EXPECT_EQ(worker_sha(third, *second.weights), third.info.sha256);
  EXPECT_LT(error(*third.weights, 3), 1.5 * error(*first.weights, 1));
  std::filesystem::remove_all(spool);
}

}  // namespace
}  // namespace parsyn::coordinator
