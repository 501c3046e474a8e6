#include "coordinator/global_weights.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>

namespace parsyn::coordinator {
namespace {

std::shared_ptr<weights::WeightSet> SharedOneTensor(float value) {
  auto set = std::make_shared<weights::WeightSet>();
  const std::array<float, 1> values{value};
  EXPECT_TRUE(set->Add("w", weights::DType::kF32, {1}, std::as_bytes(std::span(values))).ok());
  return set;
}

TEST(GlobalWeightsTest, SetMakesALoadedGlobalTheCommittedOne) {
  GlobalWeights global;
  EXPECT_EQ(global.weights(), nullptr);
  EXPECT_EQ(global.size_bytes(), 0u);
  std::shared_ptr<weights::WeightSet> initial = SharedOneTensor(1);
  global.Set("jobs/1/rounds/000000/global.safetensors", "aa", 120, initial);
  EXPECT_EQ(global.key(), "jobs/1/rounds/000000/global.safetensors");
  EXPECT_EQ(global.sha256(), "aa");
  EXPECT_EQ(global.size_bytes(), 120u);
  EXPECT_EQ(global.weights(), initial);
  global.ReleaseWeights();  // the job ended: the blob stays described, the memory goes
  EXPECT_EQ(global.weights(), nullptr);
  EXPECT_EQ(global.key(), "jobs/1/rounds/000000/global.safetensors");
}

TEST(GlobalWeightsTest, APendingGlobalReplacesTheCommittedOneOnlyWhenItCommits) {
  GlobalWeights global;
  global.Set("g0", "s0", 100, SharedOneTensor(0));
  EXPECT_FALSE(global.pending().has_value());
  std::shared_ptr<weights::WeightSet> aggregated = SharedOneTensor(2);
  global.SetPending({.key = "g1", .sha256 = "s1", .weights = aggregated});
  ASSERT_TRUE(global.pending().has_value());
  EXPECT_EQ(global.pending()->key, "g1");
  EXPECT_EQ(global.key(), "g0");  // tasks still get the committed global

  global.DropPending();  // the round failed
  EXPECT_FALSE(global.pending().has_value());
  EXPECT_EQ(global.key(), "g0");

  global.SetPending({.key = "g1", .sha256 = "s1", .weights = aggregated});
  global.CommitPending(104);
  EXPECT_FALSE(global.pending().has_value());
  EXPECT_EQ(global.key(), "g1");
  EXPECT_EQ(global.sha256(), "s1");
  EXPECT_EQ(global.size_bytes(), 104u);
  EXPECT_EQ(global.weights(), aggregated);
}

TEST(GlobalWeightsTest, PendingValidationLossWaitsForTheCommit) {
  GlobalWeights global;
  EXPECT_FALSE(global.pending_validation_loss().has_value());
  global.set_pending_validation_loss(0.75);
  EXPECT_EQ(global.pending_validation_loss(), 0.75);
  global.DropPendingValidationLoss();
  EXPECT_FALSE(global.pending_validation_loss().has_value());
}

TEST(GlobalWeightsTest, TheZstdCopyIsOfferedOnlyWhileItsGlobalIsTheCommittedOne) {
  GlobalWeights global;
  global.Set("g1", "s1", 100, SharedOneTensor(1));
  EXPECT_EQ(global.zstd_copy(), nullptr);
  global.SetZstdCopy({.of_global = "g1", .key = "g1.zst", .sha256 = "z1", .size_bytes = 40});
  ASSERT_NE(global.zstd_copy(), nullptr);
  EXPECT_EQ(global.zstd_copy()->key, "g1.zst");
  EXPECT_EQ(global.zstd_copy()->size_bytes, 40u);

  global.SetPending({.key = "g2", .sha256 = "s2", .weights = SharedOneTensor(2)});
  global.CommitPending(100);
  EXPECT_EQ(global.zstd_copy(), nullptr);  // a copy of the previous global

  global.SetZstdCopy({.of_global = "g2", .key = "g2.zst", .sha256 = "z2", .size_bytes = 41});
  ASSERT_NE(global.zstd_copy(), nullptr);
  global.ForgetZstdCopy();
  EXPECT_EQ(global.zstd_copy(), nullptr);
}

}  // namespace
}  // namespace parsyn::coordinator
