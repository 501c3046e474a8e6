#include "secagg/round_setup.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

namespace parsyn::secagg {
namespace {

std::vector<uint64_t> Ids(size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = 10 + 3 * i;
  return ids;
}

TEST(RoundSetupTest, DefaultsFollowTheStatedRules) {
  EXPECT_EQ(DefaultThreshold(3), 2u);
  EXPECT_EQ(DefaultThreshold(10), 7u);
  EXPECT_EQ(DefaultThreshold(100), 67u);
  EXPECT_EQ(DefaultNeighbors(10), 9u);
  EXPECT_EQ(DefaultNeighbors(16), 15u);
  EXPECT_EQ(DefaultNeighbors(17), 14u);   // ceil(3 * 4.09) = 13, even: 14
  EXPECT_EQ(DefaultNeighbors(100), 20u);  // ceil(3 * 6.64) = 20
}

TEST(RoundSetupTest, TheMaskingGraphIsRegularAndSymmetric) {
  for (size_t n : {2u, 5u, 16u, 17u, 50u, 100u}) {
    auto setup = MakeRoundSetup("job 1 round 2 attempt 1", Ids(n), DefaultThreshold(n), DefaultNeighbors(n), 16, 8.0,
                                11, *RandomKey());
    ASSERT_TRUE(setup.ok()) << setup.status().ToString();
    for (uint64_t id : setup->participants) {
      const std::vector<uint64_t> mine = Neighbors(*setup, id);
      EXPECT_EQ(mine.size(), setup->neighbors) << n;
      EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
      EXPECT_EQ(std::count(mine.begin(), mine.end(), id), 0);
      for (uint64_t other : mine) {
        const std::vector<uint64_t> theirs = Neighbors(*setup, other);
        EXPECT_TRUE(std::binary_search(theirs.begin(), theirs.end(), id)) << id << " and " << other;
      }
    }
    EXPECT_TRUE(Neighbors(*setup, 11).empty());
    const std::map<uint64_t, std::vector<uint64_t>> all = AllNeighbors(*setup);
    EXPECT_EQ(all.size(), n);
    for (const auto& [id, neighbors] : all) EXPECT_EQ(neighbors, Neighbors(*setup, id)) << id;
  }
}

TEST(RoundSetupTest, AnotherGraphSeedGivesAnotherGraph) {
  auto a = *MakeRoundSetup("a", Ids(60), 40, 12, 16, 8.0, 11, *RandomKey());
  auto b = a;
  b.graph_seed = *RandomKey();
  size_t differ = 0;
  for (uint64_t id : a.participants) differ += Neighbors(a, id) != Neighbors(b, id);
  EXPECT_GT(differ, 50u);
}

TEST(RoundSetupTest, TheShareThresholdIsAMajorityOfHoldersAtLeast) {
  auto all = *MakeRoundSetup("a", Ids(10), 7, 9, 16, 8.0, 11, Key32{});
  EXPECT_EQ(all.share_threshold, 7u);  // complete graph: the threshold itself
  auto low = *MakeRoundSetup("a", Ids(10), 2, 9, 16, 8.0, 11, Key32{});
  EXPECT_EQ(low.share_threshold, 6u);  // a majority of 10 holders
  auto sparse = *MakeRoundSetup("a", Ids(100), 67, 20, 16, 8.0, 11, Key32{});
  EXPECT_EQ(sparse.share_threshold, 15u);  // ceil(67 * 21 / 100)
  EXPECT_EQ(sparse.ring_bits, 32);
  EXPECT_EQ(MakeRoundSetup("a", Ids(10), 7, 9, 8, 8.0, 11, Key32{})->ring_bits, 16);
}

TEST(RoundSetupTest, ASetupWithLoweredThresholdsIsRefused) {
  const RoundSetup good = *MakeRoundSetup("a", Ids(10), 7, 9, 16, 8.0, 11, Key32{});
  EXPECT_TRUE(CheckRoundSetup(good).ok());
  RoundSetup bad = good;
  bad.share_threshold = 1;
  EXPECT_EQ(CheckRoundSetup(bad).code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.ring_bits = 16;
  EXPECT_EQ(CheckRoundSetup(bad).code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.participants = {1, 1, 2};
  EXPECT_EQ(CheckRoundSetup(bad).code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.min_survivors = 11;
  EXPECT_EQ(CheckRoundSetup(bad).code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.neighbors = 3;
  EXPECT_EQ(CheckRoundSetup(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeRoundSetup("a", Ids(1), 1, 1, 16, 8.0, 11, Key32{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeRoundSetup("a", Ids(5), 0, 4, 16, 8.0, 11, Key32{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeRoundSetup("a", Ids(5), 1, 4, 16, 8.0, 11, Key32{}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::secagg
