#include "coordinator/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "coordinator/partition.h"

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

// ---- non-IID partitioners (partition.h)

namespace parsyn::coordinator {
namespace {

// `per_class[c]` rows of class c, interleaved in file order (row r has class r % num_classes while it lasts).
data::RowLabels Labels(const std::vector<int>& per_class) {
  data::RowLabels rows;
  std::vector<int> left = per_class;
  for (size_t c = 0; c < per_class.size(); ++c) rows.class_names.push_back(std::to_string(c));
  for (bool any = true; any;) {
    any = false;
    for (size_t c = 0; c < left.size(); ++c) {
      if (left[c] == 0) continue;
      --left[c];
      rows.labels.push_back(static_cast<int32_t>(c));
      any = true;
    }
  }
  return rows;
}

DataPartition Dirichlet(double alpha) {
  DataPartition p;
  p.method = PartitionMethod::kDirichlet;
  p.alpha = alpha;
  return p;
}

DataPartition ShardsPerWorker(int classes_per_worker) {
  DataPartition p;
  p.method = PartitionMethod::kShardsPerWorker;
  p.classes_per_worker = classes_per_worker;
  p.label = "label";
  return p;
}

std::vector<std::vector<int64_t>> Histograms(const data::RowLabels& rows, int shards, double validation_fraction,
                                             const DataPartition& partition, uint64_t seed) {
  StatusOr<std::vector<Shard>> split = SplitRowsByLabel(rows, shards, validation_fraction, partition, seed);
  EXPECT_TRUE(split.ok()) << split.status().ToString();
  if (!split.ok()) return {};
  std::set<int64_t> seen;
  for (const Shard& s : *split) {
    EXPECT_GE(s.train_rows.size(), 1u);
    EXPECT_TRUE(std::is_sorted(s.train_rows.begin(), s.train_rows.end()));
    EXPECT_EQ(
        static_cast<int64_t>(s.validation_rows.size()),
        std::min<int64_t>(std::llround(static_cast<double>(s.num_rows()) * validation_fraction), s.num_rows() - 1));
    for (const auto* list : {&s.train_rows, &s.validation_rows}) {
      for (int64_t r : *list) EXPECT_TRUE(seen.insert(r).second) << "row " << r << " is in two shards";
    }
  }
  EXPECT_EQ(seen.size(), rows.labels.size());  // every row in exactly one shard
  return LabelHistograms(*split, rows);
}

TEST(PartitionTest, GammaAndDirichletDrawsHaveTheirDistributionsMeans) {
  constexpr int kDraws = 20000;
  // Gamma(a, 1) has mean a and variance a: the sample mean is within 5 standard errors, 5 * sqrt(a / n).
  for (double shape : {0.05, 0.3, 1.0, 4.5}) {
    PartitionRandom random(7);
    double sum = 0;
    for (int i = 0; i < kDraws; ++i) sum += std::exp(random.LogGamma(shape));
    EXPECT_NEAR(sum / kDraws, shape, 5 * std::sqrt(shape / kDraws)) << "shape " << shape;
  }
  // Symmetric Dir(alpha) over k: each component has mean 1/k and variance (1/k)(1 - 1/k) / (k alpha + 1); the mean
  // is within 5 standard errors and the variance within 10%.
  for (double alpha : {0.1, 0.5, 2.0}) {
    constexpr int k = 5;
    PartitionRandom random(11);
    std::vector<double> sum(k, 0), sum_sq(k, 0);
    for (int i = 0; i < kDraws; ++i) {
      const std::vector<double> p = random.Dirichlet(k, alpha);
      double total = 0;
      for (int j = 0; j < k; ++j) {
        EXPECT_GE(p[j], 0.0);
        total += p[j];
        sum[j] += p[j];
        sum_sq[j] += p[j] * p[j];
      }
      ASSERT_NEAR(total, 1.0, 1e-12);
    }
    const double mean = 1.0 / k, variance = mean * (1 - mean) / (k * alpha + 1);
    for (int j = 0; j < k; ++j) {
      const double m = sum[j] / kDraws;
      EXPECT_NEAR(m, mean, 5 * std::sqrt(variance / kDraws)) << "alpha " << alpha << " component " << j;
      EXPECT_NEAR(sum_sq[j] / kDraws - m * m, variance, 0.1 * variance) << "alpha " << alpha << " component " << j;
    }
  }
  // A tiny alpha does not underflow: one component takes (nearly) everything.
  PartitionRandom random(3);
  const std::vector<double> p = random.Dirichlet(4, 1e-4);
  EXPECT_NEAR(*std::max_element(p.begin(), p.end()), 1.0, 1e-6);
}

TEST(PartitionTest, DirichletSplitIsPinnedForASeed) {
  const data::RowLabels rows = Labels({40, 30, 20});
  const DataPartition dirichlet = Dirichlet(0.5);
  const std::vector<std::vector<int64_t>> histograms = Histograms(rows, 4, 0.1, dirichlet, 42);
  // Pinned: a change here changes how every stored Dirichlet job splits.
  const std::vector<std::vector<int64_t>> expected = {{3, 2, 8}, {17, 17, 1}, {15, 6, 3}, {0, 3, 5}};
  EXPECT_EQ(histograms, expected);
  EXPECT_EQ(Histograms(rows, 4, 0.1, dirichlet, 42), histograms);  // the same again
  EXPECT_NE(Histograms(rows, 4, 0.1, dirichlet, 43), histograms);  // another seed, another split
  // A large alpha is close to IID: every worker has every class.
  for (const auto& h : Histograms(rows, 4, 0.0, Dirichlet(1000), 42)) {
    for (int64_t count : h) EXPECT_GT(count, 0);
  }
}

TEST(PartitionTest, DirichletFindsADrawWithoutEmptyWorkersOrFailsNamingAlpha) {
  // 3 workers, 2 classes of 50 rows, alpha 0.05: most draws give each class to one worker, leaving one empty; the
  // split still gives every worker rows (a later draw).
  const data::RowLabels two = Labels({50, 50});
  const DataPartition sparse = Dirichlet(0.05);
  for (const auto& h : Histograms(two, 3, 0.0, sparse, 5)) EXPECT_GT(h[0] + h[1], 0);
  // One class: every draw gives (nearly) all rows to one worker.
  const data::RowLabels one = Labels({10});
  StatusOr<std::vector<Shard>> split = SplitRowsByLabel(one, 3, 0.0, Dirichlet(1e-4), 42);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(split.status().message(),
            "distributed.partition.alpha (0.0001): 100 Dirichlet draws each left one of the 3 workers without rows "
            "(10 rows, 1 class); raise alpha, use fewer workers or a larger dataset");
}

TEST(PartitionTest, ShardsPerWorkerGivesEachWorkerExactlyItsClasses) {
  struct Case {
    std::vector<int> per_class;
    int workers;
    int classes_per_worker;
  };
  // Classes whose sizes are multiples of the piece size N / (workers * classes_per_worker), each at most N / cpw.
  const Case cases[] = {{std::vector<int>(10, 60), 10, 2},
                        {std::vector<int>(5, 30), 5, 3},
                        {{20, 20, 20, 20}, 4, 1},
                        {std::vector<int>(10, 30), 5, 4}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.workers << " workers, " << c.classes_per_worker << " classes each");
    const DataPartition partition = ShardsPerWorker(c.classes_per_worker);
    for (uint64_t seed : {1, 2, 3}) {
      for (const auto& h : Histograms(Labels(c.per_class), c.workers, 0.0, partition, seed)) {
        EXPECT_EQ(std::count_if(h.begin(), h.end(), [](int64_t n) { return n > 0; }), c.classes_per_worker);
      }
    }
  }
  // Pinned for a seed, with a validation slice.
  const DataPartition two = ShardsPerWorker(2);
  const std::vector<std::vector<int64_t>> expected = {{8, 0, 8, 0}, {0, 10, 0, 6}, {9, 0, 7, 0}, {0, 7, 0, 9}};
  EXPECT_EQ(Histograms(Labels({20, 20, 20, 20}), 4, 0.2, two, 42), expected);
}

TEST(PartitionTest, ShardsPerWorkerRefusesWhatTheDataCannotGive) {
  const DataPartition three = ShardsPerWorker(3);
  StatusOr<std::vector<Shard>> split = SplitRowsByLabel(Labels({10, 10}), 2, 0.0, three, 42);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(),
            "distributed.partition.classes_per_worker (3) exceeds the 2 classes of the label \"label\"; use at most 2");
  split = SplitRowsByLabel(Labels({2, 2, 1}), 2, 0.0, three, 42);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().message(),
            "distributed.partition.classes_per_worker (3): the dataset has 5 rows, fewer than the 2 workers x 3 = 6 "
            "pieces to cut");
}

TEST(PartitionTest, IidIsSplitRowsAndHistogramsAreJson) {
  const data::RowLabels rows = Labels({7, 5, 3});
  StatusOr<std::vector<Shard>> by_label = SplitRowsByLabel(rows, 3, 0.2, DataPartition{}, 9);
  StatusOr<std::vector<Shard>> plain = SplitRows(15, 3, 0.2, 9);
  ASSERT_TRUE(by_label.ok() && plain.ok());
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ((*by_label)[k].train_rows, (*plain)[k].train_rows);
    EXPECT_EQ((*by_label)[k].validation_rows, (*plain)[k].validation_rows);
  }
  const std::vector<int64_t> counts = {3, 0, 12};
  EXPECT_EQ(LabelHistogramJson(counts, {"2", "10", "cat"}), R"({"2":3,"cat":12})");
}

}  // namespace
}  // namespace parsyn::coordinator
