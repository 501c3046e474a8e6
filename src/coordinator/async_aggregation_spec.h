// AsyncAggregationSpec: a job's distributed.aggregation and distributed.async (docs/training.md, "Asynchronous
// aggregation"), read beside the rest of the distributed section.
//
//   field                               type     default           range / values
//   aggregation                         string   "sync"            "sync" | "async"
//   async.buffer_size                   integer  10                1..10000: updates per version (K)
//   async.max_concurrency               integer  max_workers       1..10000: workers training at once
//   async.max_staleness                 integer  20                0..10000: versions; older updates are refused
//   async.staleness_weighting           string or object "polynomial" "polynomial" | "constant" |
//                                                                   {"polynomial": {"exponent": a}} with a in [0, 10]
//   async.server_learning_rate          number   1.0               (0, 10]
//   (exponent of "polynomial": 0.5)
//
// Cross-field rules: a distributed job only; buffer_size <= max_concurrency <= max_workers; no secure aggregation
// (its masks cancel only within one cohort's sum, and a buffer mixes updates of different versions); async given
// only with aggregation "async".
//
// Pure functions; safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "strategy/buffered_aggregation.h"

namespace parsyn::coordinator {

struct AsyncAggregationSpec {
  bool enabled = false;  // aggregation "async"
  int buffer_size = 10;
  std::optional<int> max_concurrency;  // absent: max_workers (MaxConcurrency)
  int max_staleness = 20;
  strategy::StalenessWeighting staleness_weighting;
  double server_learning_rate = 1.0;

  // Workers training at once: max_concurrency, or the job's max_workers.
  int MaxConcurrency(int max_workers) const { return max_concurrency.value_or(max_workers); }

  friend bool operator==(const AsyncAggregationSpec& a, const AsyncAggregationSpec& b) {
    return a.enabled == b.enabled && a.buffer_size == b.buffer_size && a.max_concurrency == b.max_concurrency &&
           a.max_staleness == b.max_staleness && a.staleness_weighting.rule == b.staleness_weighting.rule &&
           a.staleness_weighting.exponent == b.staleness_weighting.exponent &&
           a.server_learning_rate == b.server_learning_rate;
  }
};

// Reads distributed.aggregation (`aggregation`, null when absent) and distributed.async (`async`, null when absent),
// appending each problem with its field path.
void ParseAsyncAggregation(const nlohmann::json* aggregation, const nlohmann::json* async, AsyncAggregationSpec& spec,
                           std::vector<std::string>& errors);

// The cross-field rules above, each problem naming the fields and what to do.
void CheckAsyncAggregation(const AsyncAggregationSpec& spec, bool distributed, int max_workers, bool secure_aggregation,
                           std::vector<std::string>& errors);

// The normalised `async` object (every field; max_concurrency only when given).
nlohmann::json AsyncAggregationToJson(const AsyncAggregationSpec& spec);

}  // namespace parsyn::coordinator
