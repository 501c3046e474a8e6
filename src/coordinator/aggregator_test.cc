#include "coordinator/aggregator.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "coordinator/job_runner_internal.h"
#include "storage/memory_blob_store.h"
#include "strategy/strategy_options.h"

namespace parsyn::coordinator {
namespace {

constexpr char kGlobalKey[] = "jobs/1/rounds/000001-a1/global.safetensors";
constexpr char kStateKey[] = "jobs/1/rounds/000001-a1/server_state.safetensors";

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
  ASSERT_TRUE(aggregator.Begin(1, OneValue(0)).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(1), 1, std::nullopt).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(3), 3, std::nullopt).ok());
  storage::MemoryBlobStore blobs;
  Aggregator::FinishTimings timings;
  StatusOr<Aggregator::Aggregated> aggregated = aggregator.FinishRound(blobs, kGlobalKey, kStateKey, &timings);
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
  EXPECT_EQ(aggregator.FinishRound(empty, kGlobalKey, kStateKey, &timings).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(empty.Head(kGlobalKey).status().code(), StatusCode::kNotFound);
}

TEST(AggregatorTest, AStatefulStrategysStateIsStoredAndNamedByTheGlobal) {
  Aggregator aggregator(JobWithId(1), SpecOf(strategy::StrategyKind::kFedAdam), 2);
  ASSERT_TRUE(aggregator.strategy()->has_state());
  ASSERT_TRUE(aggregator.Begin(1, OneValue(0)).ok());
  ASSERT_TRUE(aggregator.AcceptOwned(OneValue(1), 1, std::nullopt).ok());
  storage::MemoryBlobStore blobs;
  Aggregator::FinishTimings timings;
  StatusOr<Aggregator::Aggregated> aggregated = aggregator.FinishRound(blobs, kGlobalKey, kStateKey, &timings);
  ASSERT_TRUE(aggregated.ok()) << aggregated.status().ToString();
  StatusOr<storage::BlobInfo> state = blobs.Head(kStateKey);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(aggregated->weights->metadata().at(kServerStateShaKey), state->sha256);
}

}  // namespace
}  // namespace parsyn::coordinator
