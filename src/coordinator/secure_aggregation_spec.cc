#include "coordinator/secure_aggregation_spec.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using strategy::StrategyKind;

constexpr int kMaxCount = 10000;

void ParseThreshold(protocol::FieldReader& r, SecureAggregationSpec& spec) {
  const json* value = r.Get("threshold");
  if (value == nullptr) return;
  if (value->is_number_integer() || value->is_number_unsigned()) {
    int count = 0;
    r.Integer("threshold", count, 2, kMaxCount);
    spec.threshold_count = count;
    return;
  }
  double fraction = 0;
  r.Number("threshold", fraction, 0, 1, /*min_exclusive=*/true);
  spec.threshold_fraction = fraction;
}

bool AveragesUpdates(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kMedian:
    case StrategyKind::kTrimmedMean:
    case StrategyKind::kKrum:
    case StrategyKind::kMultiKrum: return false;
    default: return true;
  }
}

}  // namespace

void ParseSecureAggregation(const json* object, SecureAggregationSpec& spec, std::vector<std::string>& errors) {
  spec = {};
  if (object == nullptr) return;
  protocol::FieldReader r(*object, "distributed.secure_aggregation.", errors);
  r.Boolean("enabled", spec.enabled);
  ParseThreshold(r, spec);
  if (r.Get("neighbors") != nullptr) {
    int neighbors = 0;
    r.Integer("neighbors", neighbors, 2, kMaxCount);
    spec.neighbors = neighbors;
  }
  r.Number("clipping_range", spec.clipping_range, 0, 1e6, /*min_exclusive=*/true);
  if (const json* bits = r.Get("quantization_bits")) {
    if (!(bits->is_number_integer() && (*bits == 8 || *bits == 16))) {
      r.Error("distributed.secure_aggregation.quantization_bits must be 8 or 16, got " + bits->dump());
    } else {
      spec.quantization_bits = bits->get<int>();
    }
  }
  r.RejectUnknown();
}

void CheckSecureAggregation(const SecureAggregationSpec& spec, bool distributed, StrategyKind strategy,
                            const protocol::UpdateCompression& compression, int min_workers,
                            std::vector<std::string>& errors) {
  if (!spec.enabled) return;
  const std::string name = "distributed.secure_aggregation";
  if (!distributed) {
    errors.push_back(name + " needs distributed.enabled true: a job on one worker has no sum to hide its update in");
  }
  if (!AveragesUpdates(strategy)) {
    errors.push_back(name + " cannot run with distributed.strategy \"" +
                     std::string(strategy::StrategyKindName(strategy)) +
                     "\", which needs each worker's update, and the coordinator sees only their sum; use "
                     "federated_averaging, fedprox, a server optimizer (fedavgm, fedadam, fedyogi, fedadagrad) or "
                     "dp_fedavg");
  }
  if (compression.update != "none" || compression.delta || compression.error_feedback || compression.zstd_level > 0) {
    errors.push_back(name +
                     " replaces distributed.compression's update encoding (update, delta, error_feedback, "
                     "zstd_level): quantization_bits is its compression; remove them from distributed.compression");
  }
  if (distributed && spec.threshold_count && *spec.threshold_count > min_workers) {
    errors.push_back(name + ".threshold (" + std::to_string(*spec.threshold_count) +
                     ") must be <= distributed.min_workers (" + std::to_string(min_workers) +
                     "): a round may start with min_workers participants, and could then never be unmasked");
  }
  if (distributed && min_workers < 2) {
    errors.push_back(name + " needs distributed.min_workers >= 2: a sum of one update is that update");
  }
}

json SecureAggregationToJson(const SecureAggregationSpec& spec) {
  json out = {{"enabled", spec.enabled},
              {"clipping_range", spec.clipping_range},
              {"quantization_bits", spec.quantization_bits}};
  if (spec.threshold_count) out["threshold"] = *spec.threshold_count;
  if (spec.threshold_fraction) out["threshold"] = *spec.threshold_fraction;
  if (spec.neighbors) out["neighbors"] = *spec.neighbors;
  return out;
}

size_t ThresholdFor(const SecureAggregationSpec& spec, size_t participants) {
  size_t threshold = secagg::DefaultThreshold(participants);
  if (spec.threshold_count) threshold = static_cast<size_t>(*spec.threshold_count);
  if (spec.threshold_fraction) {
    threshold = static_cast<size_t>(std::ceil(*spec.threshold_fraction * static_cast<double>(participants) - 1e-9));
  }
  return std::min(participants, std::max<size_t>(threshold, 2));
}

std::optional<std::string> SecureThresholdWarning(const SecureAggregationSpec& spec, size_t participants) {
  if (!spec.enabled || participants < 2) return std::nullopt;
  std::vector<uint64_t> ids(participants);
  for (size_t i = 0; i < participants; ++i) ids[i] = i + 1;
  const StatusOr<secagg::RoundSetup> setup = SecureAttemptSetup(spec, 0, 1, 1, std::move(ids), 2, secagg::Key32{});
  if (!setup.ok() || setup->share_threshold <= setup->min_survivors) return std::nullopt;
  const std::string needed = std::to_string(setup->share_threshold);
  return "distributed.secure_aggregation.threshold (" + std::to_string(setup->min_survivors) + " of " +
         std::to_string(participants) + " workers, distributed.max_workers) is below what unmasking needs: each " +
         "worker's secrets are rebuilt from " + needed + " of its " + std::to_string(setup->neighbors + 1) +
         " share holders (itself and its neighbors, a majority), so an attempt with fewer than " + needed +
         " survivors fails at unmasking and the round runs again; set threshold to " + needed +
         " or more to say what the job needs";
}

std::string SecureAttemptName(int64_t job_id, int round, int attempt) {
  return "job " + std::to_string(job_id) + " round " + std::to_string(round) + " attempt " + std::to_string(attempt);
}

StatusOr<secagg::RoundSetup> SecureAttemptSetup(const SecureAggregationSpec& spec, int64_t job_id, int round,
                                                int attempt, std::vector<uint64_t> participants, size_t vector_length,
                                                const secagg::Key32& graph_seed) {
  const size_t n = participants.size();
  const size_t neighbors = spec.neighbors ? static_cast<size_t>(*spec.neighbors) : secagg::DefaultNeighbors(n);
  return secagg::MakeRoundSetup(SecureAttemptName(job_id, round, attempt), std::move(participants),
                                ThresholdFor(spec, n), neighbors, spec.quantization_bits, spec.clipping_range,
                                vector_length, graph_seed);
}

}  // namespace parsyn::coordinator
