// SecureAggregationSpec: a job's distributed.secure_aggregation (docs/secure-aggregation.md), read beside the rest of
// the distributed section, and what each round's attempt derives from it (secagg::RoundSetup).
//
//   field                                   type              default         range / values
//   secure_aggregation.enabled              boolean           false
//   secure_aggregation.threshold            integer or number ceil(2n/3)      an integer: a count, 2..10000; a
//                                                                             number in (0, 1]: that fraction of
//                                                                             the round's n participants (at least 2)
//   secure_aggregation.neighbors            integer           all for n <= 16, 2..10000: each worker's degree in the
//                                                             else ceil(3     masking graph (rounded up to even,
//                                                             log2 n), even   at most n - 1)
//   secure_aggregation.clipping_range       number            8.0             (0, 10^6]: values clipped to [-c, c]
//   secure_aggregation.quantization_bits    integer           16              8 | 16
//
// Cross-field rules: a distributed job only; a strategy whose new global is the updates' weighted mean
// (federated_averaging, fedprox, the server optimizers fedavgm/fedadam/fedyogi/fedadagrad) or its unweighted mean with
// noise (dp_fedavg: each worker clips and adds its share of the noise, secagg::ClipAndAddNoise), never one that needs
// individual updates (median, trimmed_mean, krum, multi_krum); no update compression (update, delta,
// error_feedback, zstd_level: quantization_bits is the uplink's compression), the downlink's distributed.compression
// .global may stay; a threshold count at most distributed.min_workers (a round may start with that many).
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "protocol/messages.h"
#include "secagg/round_setup.h"
#include "strategy/strategy_options.h"

namespace parsyn::coordinator {

struct SecureAggregationSpec {
  bool enabled = false;
  std::optional<int> threshold_count;        // threshold given as an integer
  std::optional<double> threshold_fraction;  // threshold given as a number in (0, 1]
  std::optional<int> neighbors;              // absent: secagg::DefaultNeighbors
  double clipping_range = 8.0;
  int quantization_bits = 16;

  friend bool operator==(const SecureAggregationSpec&, const SecureAggregationSpec&) = default;
};

// Reads distributed.secure_aggregation (`object`, null when absent), appending each problem with its field path.
void ParseSecureAggregation(const nlohmann::json* object, SecureAggregationSpec& spec,
                            std::vector<std::string>& errors);

// The cross-field rules above, each problem naming both fields and what to do.
void CheckSecureAggregation(const SecureAggregationSpec& spec, bool distributed, strategy::StrategyKind strategy,
                            const protocol::UpdateCompression& compression, int min_workers,
                            std::vector<std::string>& errors);

// The normalised form: every field (threshold as given, neighbors only when given).
nlohmann::json SecureAggregationToJson(const SecureAggregationSpec& spec);

// The threshold for a round of `participants`: the count, ceil(fraction n) or ceil(2n/3), at least 2 and at most n.
size_t ThresholdFor(const SecureAggregationSpec& spec, size_t participants);

// A threshold below what unmasking needs: in a round of `participants` workers each needed secret is rebuilt from
// its share threshold of holders (a majority of a worker and its neighbors, secagg::MakeRoundSetup), and when that is
// above the threshold, an attempt with fewer survivors than it fails at unmasking whatever the threshold says. The
// warning naming both numbers and what to set; nullopt when the threshold is at least the share threshold.
std::optional<std::string> SecureThresholdWarning(const SecureAggregationSpec& spec, size_t participants);

// Attempt `attempt` of round `round` of job `job_id`: its name (bound into every key, signature and share, so that
// nothing of one attempt counts in another) and its setup. `vector_length` is the exchanged parameters plus the weight.
std::string SecureAttemptName(int64_t job_id, int round, int attempt);
StatusOr<secagg::RoundSetup> SecureAttemptSetup(const SecureAggregationSpec& spec, int64_t job_id, int round,
                                                int attempt, std::vector<uint64_t> participants, size_t vector_length,
                                                const secagg::Key32& graph_seed);

}  // namespace parsyn::coordinator
