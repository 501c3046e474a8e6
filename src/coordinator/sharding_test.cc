#include "coordinator/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace parsyn::coordinator {
namespace {

struct SplitCase {
  int64_t rows;
  int shards;
  double validation_fraction;
};

TEST(ShardingTest, ShardsAreNearlyEqualDisjointAndCoverAllRows) {
  const SplitCase cases[] = {{10, 1, 0.1}, {10, 3, 0.1}, {7, 7, 0.5}, {1000, 4, 0.0}, {1001, 5, 0.2}, {3, 2, 0.5}};
  for (const SplitCase& c : cases) {
    SCOPED_TRACE(testing::Message() << c.rows << " rows, " << c.shards << " shards, fraction "
                                    << c.validation_fraction);
    StatusOr<std::vector<Shard>> shards = SplitRows(c.rows, c.shards, c.validation_fraction, 42);
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    ASSERT_EQ(shards->size(), static_cast<size_t>(c.shards));

    int64_t smallest = c.rows, largest = 0;
    std::set<int64_t> seen;
    for (const Shard& s : *shards) {
      smallest = std::min(smallest, s.num_rows());
      largest = std::max(largest, s.num_rows());
      EXPECT_GE(s.train_rows.size(), 1u);
      EXPECT_TRUE(std::is_sorted(s.train_rows.begin(), s.train_rows.end()));
      EXPECT_TRUE(std::is_sorted(s.validation_rows.begin(), s.validation_rows.end()));
      const int64_t expected_validation =
          std::min<int64_t>(std::llround(static_cast<double>(s.num_rows()) * c.validation_fraction), s.num_rows() - 1);
      EXPECT_EQ(static_cast<int64_t>(s.validation_rows.size()), expected_validation);
      for (const auto* rows : {&s.train_rows, &s.validation_rows}) {
        for (int64_t r : *rows) {
          EXPECT_TRUE(r >= 0 && r < c.rows) << r;
          EXPECT_TRUE(seen.insert(r).second) << "row " << r << " is in two places";
        }
      }
    }
    EXPECT_LE(largest - smallest, 1);
    EXPECT_EQ(static_cast<int64_t>(seen.size()), c.rows);  // union is all rows
  }
}

TEST(ShardingTest, DeterministicFromTheJobSeedAndDifferentAcrossSeeds) {
  auto split = [](uint64_t seed) {
    StatusOr<std::vector<Shard>> shards = SplitRows(200, 3, 0.1, seed);
    EXPECT_TRUE(shards.ok());
    std::vector<std::vector<int64_t>> out;
    for (const Shard& s : *shards) {
      out.push_back(s.train_rows);
      out.push_back(s.validation_rows);
    }
    return out;
  };
  EXPECT_EQ(split(7), split(7));
  EXPECT_NE(split(7), split(8));
  // Pinned: the split of a stored job must not change between versions (first rows of shard 0 for seed 7).
  const std::vector<int64_t> first_train = split(7)[0];
  const std::vector<int64_t> pinned(first_train.begin(), first_train.begin() + 5);
  EXPECT_EQ(pinned, (std::vector<int64_t>{1, 4, 5, 6, 11}));
}

TEST(ShardingTest, IsRandomNotContiguous) {
  StatusOr<std::vector<Shard>> shards = SplitRows(100, 2, 0.0, 1);
  ASSERT_TRUE(shards.ok());
  const std::vector<int64_t>& rows = (*shards)[0].train_rows;
  // A contiguous split would give rows 0..49 exactly.
  EXPECT_NE(rows.back() - rows.front(), 49);
}

TEST(ShardingTest, RejectsImpossibleSplits) {
  StatusOr<std::vector<Shard>> s = SplitRows(3, 5, 0.1, 1);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "the dataset has 3 rows, fewer than the 5 shards it must be split into");
  s = SplitRows(10, 0, 0.1, 1);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "number of shards must be >= 1, got 0");
  EXPECT_EQ(SplitRows(10, 2, 0.7, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitRows(10, 2, -0.1, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(ShardingTest, TrainRowCountsAreThoseOfTheSplit) {
  const SplitCase cases[] = {{10, 1, 0.1}, {10, 3, 0.1}, {7, 7, 0.5}, {1000, 4, 0.0}, {1001, 5, 0.2}, {3, 2, 0.5}};
  for (const SplitCase& c : cases) {
    StatusOr<std::vector<Shard>> shards = SplitRows(c.rows, c.shards, c.validation_fraction, 99);
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    std::vector<int64_t> expected;
    for (const Shard& s : *shards) expected.push_back(static_cast<int64_t>(s.train_rows.size()));
    EXPECT_EQ(ShardTrainRowCounts(c.rows, c.shards, c.validation_fraction), expected)
        << c.rows << " rows, " << c.shards << " shards";
  }
  EXPECT_TRUE(ShardTrainRowCounts(2, 3, 0.1).empty());
  EXPECT_TRUE(ShardTrainRowCounts(10, 0, 0.1).empty());
}

TEST(ShardingTest, WarnsOnlyWhenShardsDifferMoreThanFourTimes) {
  EXPECT_EQ(UnevenShardsWarning({100, 400}), std::nullopt);
  EXPECT_EQ(UnevenShardsWarning({100}), std::nullopt);
  EXPECT_EQ(UnevenShardsWarning(ShardTrainRowCounts(1001, 5, 0.2)), std::nullopt);
  std::optional<std::string> warning = UnevenShardsWarning({300, 100, 401});
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("more than 4x in training rows (smallest 100, largest 401)"), std::string::npos) << *warning;
}

TEST(ShardingTest, TaskSeedDependsOnRoundAndShard) {
  EXPECT_EQ(TaskSeed(5, 2, 1), TaskSeed(5, 2, 1));
  EXPECT_NE(TaskSeed(5, 2, 1), TaskSeed(5, 3, 1));
  EXPECT_NE(TaskSeed(5, 2, 1), TaskSeed(5, 2, 0));
  EXPECT_NE(TaskSeed(5, 2, 1), TaskSeed(6, 2, 1));
}

}  // namespace
}  // namespace parsyn::coordinator
