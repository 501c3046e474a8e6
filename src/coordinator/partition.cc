#include "coordinator/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "strategy/seed.h"

namespace parsyn::coordinator {
namespace {

// Separates the partition's draws from SplitRows' permutation (both start from strategy::SplitSeed).
constexpr uint64_t kPartitionDomain = 0x706172745f736464ULL;  // "part_sdd"

// Cuts each worker's pooled rows into a validation slice (a random sample) and training rows, both ascending.
std::vector<Shard> ShardsOf(std::vector<std::vector<int64_t>> pools, double validation_fraction,
                            PartitionRandom& random) {
  std::vector<Shard> shards(pools.size());
  for (size_t k = 0; k < pools.size(); ++k) {
    std::vector<int64_t>& pool = pools[k];
    std::sort(pool.begin(), pool.end());  // a fixed order before the shuffle: the draw depends on the rows only
    random.Shuffle(pool);
    const int64_t num_validation = ValidationRowsOf(static_cast<int64_t>(pool.size()), validation_fraction);
    shards[k].validation_rows.assign(pool.begin(), pool.begin() + num_validation);
    shards[k].train_rows.assign(pool.begin() + num_validation, pool.end());
    std::sort(shards[k].validation_rows.begin(), shards[k].validation_rows.end());
    std::sort(shards[k].train_rows.begin(), shards[k].train_rows.end());
  }
  return shards;
}

// Each class's rows, ascending.
std::vector<std::vector<int64_t>> RowsByClass(const data::RowLabels& rows) {
  std::vector<std::vector<int64_t>> by_class(rows.class_names.size());
  for (size_t r = 0; r < rows.labels.size(); ++r) by_class[static_cast<size_t>(rows.labels[r])].push_back(r);
  return by_class;
}

// Largest-remainder rounding of n * p_k: floors, then the leftover rows one each to the largest fractional parts
// (ties to the lower index). The counts sum to n.
std::vector<int64_t> RoundedCounts(int64_t n, const std::vector<double>& proportions) {
  std::vector<int64_t> counts(proportions.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t assigned = 0;
  for (size_t k = 0; k < proportions.size(); ++k) {
    const double quota = static_cast<double>(n) * proportions[k];
    counts[k] = std::min(n, static_cast<int64_t>(std::floor(quota)));
    assigned += counts[k];
    remainders.emplace_back(quota - static_cast<double>(counts[k]), k);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; assigned < n; i = (i + 1) % remainders.size(), ++assigned) ++counts[remainders[i].second];
  // Rounding of proportions summing to slightly over 1 could overshoot: take the excess from the largest counts.
  while (assigned > n) {
    --*std::max_element(counts.begin(), counts.end());
    --assigned;
  }
  return counts;
}

// One Dirichlet draw's pools, or an empty vector when a worker got no rows.
std::vector<std::vector<int64_t>> DirichletPools(const std::vector<std::vector<int64_t>>& by_class, int num_shards,
                                                 double alpha, PartitionRandom& random) {
  std::vector<std::vector<int64_t>> pools(static_cast<size_t>(num_shards));
  for (const std::vector<int64_t>& class_rows : by_class) {
    if (class_rows.empty()) continue;
    const std::vector<int64_t> counts =
        RoundedCounts(static_cast<int64_t>(class_rows.size()), random.Dirichlet(num_shards, alpha));
    std::vector<int64_t> order = class_rows;
    random.Shuffle(order);
    size_t next = 0;
    for (size_t k = 0; k < pools.size(); ++k) {
      for (int64_t i = 0; i < counts[k]; ++i) pools[k].push_back(order[next++]);
    }
  }
  for (const auto& pool : pools) {
    if (pool.empty()) return {};
  }
  return pools;
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

double PartitionRandom::Uniform() {
  while (true) {
    const double u = static_cast<double>(bits_.Next() >> 11) * 0x1.0p-53;
    if (u > 0.0) return u;
  }
}

double PartitionRandom::Normal() {
  while (true) {
    const double u = 2.0 * Uniform() - 1.0;
    const double v = 2.0 * Uniform() - 1.0;
    const double s = u * u + v * v;
    if (s > 0.0 && s < 1.0) return u * std::sqrt(-2.0 * std::log(s) / s);
  }
}

double PartitionRandom::LogGamma(double shape) {
  if (shape < 1.0) {
    const double boosted = LogGamma(shape + 1.0);
    return boosted + std::log(Uniform()) / shape;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x = 0, v = 0;
    do {
      x = Normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = Uniform();
    if (u < 1.0 - 0.0331 * (x * x) * (x * x)) return std::log(d * v);
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return std::log(d * v);
  }
}

std::vector<double> PartitionRandom::Dirichlet(int k, double alpha) {
  std::vector<double> logs(static_cast<size_t>(k));
  for (double& l : logs) l = LogGamma(alpha);
  // Normalised in logs: exp(l - max) keeps the largest component at 1, whatever the scale of the draws.
  const double top = *std::max_element(logs.begin(), logs.end());
  double sum = 0;
  for (double& l : logs) {
    l = std::exp(l - top);
    sum += l;
  }
  for (double& p : logs) p /= sum;
  return logs;
}

void PartitionRandom::Shuffle(std::vector<int64_t>& items) {
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[static_cast<size_t>(Below(i))]);
}

uint64_t PartitionSeed(uint64_t job_seed, int draw) {
  return strategy::Mix64((strategy::SplitSeed(job_seed) ^ kPartitionDomain) + static_cast<uint64_t>(draw));
}

StatusOr<std::vector<Shard>> SplitRowsByLabel(const data::RowLabels& rows, int num_shards, double validation_fraction,
                                              const DataPartition& partition, uint64_t job_seed) {
  const int64_t num_rows = static_cast<int64_t>(rows.labels.size());
  if (partition.method == PartitionMethod::kIid) {
    return SplitRows(num_rows, num_shards, validation_fraction, job_seed);
  }
  PARSYN_RETURN_IF_ERROR(CheckSplit(num_rows, num_shards, validation_fraction));
  const std::vector<std::vector<int64_t>> by_class = RowsByClass(rows);
  const int num_classes = static_cast<int>(rows.class_names.size());

  if (partition.method == PartitionMethod::kDirichlet) {
    for (int draw = 0; draw < kMaxDirichletDraws; ++draw) {
      PartitionRandom random(PartitionSeed(job_seed, draw));
      std::vector<std::vector<int64_t>> pools = DirichletPools(by_class, num_shards, partition.alpha, random);
      if (!pools.empty()) return ShardsOf(std::move(pools), validation_fraction, random);
    }
    return InvalidArgumentError("distributed.partition.alpha (" + nlohmann::json(partition.alpha).dump() +
                                "): " + std::to_string(kMaxDirichletDraws) + " Dirichlet draws each left one of the " +
                                std::to_string(num_shards) + " workers without rows (" + std::to_string(num_rows) +
                                " rows, " + std::to_string(num_classes) + (num_classes == 1 ? " class" : " classes") +
                                "); raise alpha, use fewer workers or a larger dataset");
  }

  // shards_per_worker
  const int per_worker = partition.classes_per_worker;
  if (per_worker > num_classes) {
    return InvalidArgumentError("distributed.partition.classes_per_worker (" + std::to_string(per_worker) +
                                ") exceeds the " + std::to_string(num_classes) + " classes of the label " +
                                Quoted(partition.label) + "; use at most " + std::to_string(num_classes));
  }
  const int64_t num_pieces = static_cast<int64_t>(num_shards) * per_worker;
  if (num_rows < num_pieces) {
    return InvalidArgumentError("distributed.partition.classes_per_worker (" + std::to_string(per_worker) +
                                "): the dataset has " + std::to_string(num_rows) + " rows, fewer than the " +
                                std::to_string(num_shards) + " workers x " + std::to_string(per_worker) + " = " +
                                std::to_string(num_pieces) + " pieces to cut");
  }
  PartitionRandom random(PartitionSeed(job_seed, 0));
  std::vector<int64_t> sorted;
  sorted.reserve(static_cast<size_t>(num_rows));
  for (const std::vector<int64_t>& class_rows : by_class) {
    std::vector<int64_t> order = class_rows;
    random.Shuffle(order);
    sorted.insert(sorted.end(), order.begin(), order.end());
  }
  std::vector<int64_t> workers(static_cast<size_t>(num_shards));
  for (size_t k = 0; k < workers.size(); ++k) workers[k] = static_cast<int64_t>(k);
  random.Shuffle(workers);
  std::vector<std::vector<int64_t>> pools(static_cast<size_t>(num_shards));
  int64_t begin = 0;
  for (int64_t s = 0; s < num_pieces; ++s) {
    const int64_t size = num_rows / num_pieces + (s < num_rows % num_pieces ? 1 : 0);
    std::vector<int64_t>& pool = pools[static_cast<size_t>(workers[static_cast<size_t>(s % num_shards)])];
    pool.insert(pool.end(), sorted.begin() + begin, sorted.begin() + begin + size);
    begin += size;
  }
  return ShardsOf(std::move(pools), validation_fraction, random);
}

std::vector<std::vector<int64_t>> LabelHistograms(const std::vector<Shard>& shards, const data::RowLabels& rows) {
  std::vector<std::vector<int64_t>> histograms;
  for (const Shard& shard : shards) {
    std::vector<int64_t> counts(rows.class_names.size(), 0);
    for (int64_t r : shard.train_rows) ++counts[static_cast<size_t>(rows.labels[static_cast<size_t>(r)])];
    histograms.push_back(std::move(counts));
  }
  return histograms;
}

std::string LabelHistogramJson(std::span<const int64_t> counts, const std::vector<std::string>& class_names) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (size_t c = 0; c < counts.size() && c < class_names.size(); ++c) {
    if (counts[c] > 0) out[class_names[c]] = counts[c];
  }
  return out.dump();
}

}  // namespace parsyn::coordinator
