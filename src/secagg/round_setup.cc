#include "secagg/round_setup.h"

#include <algorithm>
#include <cmath>

#include "secagg/ring.h"

namespace parsyn::secagg {
namespace {

constexpr uint32_t kGraphDomain = 0x53414731;  // "SAG1"
constexpr size_t kMaxParticipants = 65535;

size_t ShareThreshold(size_t participants, size_t min_survivors, size_t neighbors) {
  const size_t holders = neighbors + 1;
  const size_t majority = holders / 2 + 1;
  const size_t proportional = (min_survivors * holders + participants - 1) / participants;
  return std::min(holders, std::max(majority, proportional));
}

// The participants in the graph seed's order (Fisher-Yates on ChaCha20 words).
std::vector<uint64_t> RingOrder(const RoundSetup& setup) {
  std::vector<uint64_t> order = setup.participants;
  weights::KeyedStream stream(setup.graph_seed, kGraphDomain, 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[stream.Next() % i]);
  return order;
}

}  // namespace

size_t DefaultThreshold(size_t participants) { return (2 * participants + 2) / 3; }

size_t DefaultNeighbors(size_t participants) {
  if (participants <= 16) return participants == 0 ? 0 : participants - 1;
  size_t k = static_cast<size_t>(std::ceil(3 * std::log2(static_cast<double>(participants))));
  k += k % 2;
  return std::min(k, participants - 1);
}

StatusOr<RoundSetup> MakeRoundSetup(std::string attempt, std::vector<uint64_t> participants, size_t min_survivors,
                                    size_t neighbors, int quantization_bits, double clipping_range,
                                    size_t vector_length, const Key32& graph_seed) {
  std::sort(participants.begin(), participants.end());
  RoundSetup setup;
  setup.attempt = std::move(attempt);
  setup.participants = std::move(participants);
  const size_t n = setup.participants.size();
  setup.min_survivors = min_survivors;
  setup.neighbors = std::min(neighbors + neighbors % 2, n == 0 ? 0 : n - 1);
  setup.share_threshold = n == 0 ? 0 : ShareThreshold(n, min_survivors, setup.neighbors);
  setup.quantization_bits = quantization_bits;
  setup.clipping_range = clipping_range;
  setup.vector_length = vector_length;
  setup.graph_seed = graph_seed;
  PARSYN_ASSIGN_OR_RETURN(setup.ring_bits, RingBits(quantization_bits, n));
  PARSYN_RETURN_IF_ERROR(CheckRoundSetup(setup));
  return setup;
}

Status CheckRoundSetup(const RoundSetup& setup) {
  const size_t n = setup.participants.size();
  if (setup.attempt.empty() || setup.attempt.size() > 200)
    return InvalidArgumentError("attempt must be 1 to 200 bytes");
  if (n < 2 || n > kMaxParticipants) {
    return InvalidArgumentError("secure aggregation needs 2 to " + std::to_string(kMaxParticipants) +
                                " participants, not " + std::to_string(n));
  }
  if (!std::is_sorted(setup.participants.begin(), setup.participants.end()) ||
      std::adjacent_find(setup.participants.begin(), setup.participants.end()) != setup.participants.end()) {
    return InvalidArgumentError("participants must be distinct and ascending");
  }
  // A sum of one input is that input: at least two must survive for the sum to hide anything.
  if (setup.min_survivors < 2 || setup.min_survivors > n) {
    return InvalidArgumentError("threshold must be 2 to " + std::to_string(n) + " (the round's participants), not " +
                                std::to_string(setup.min_survivors));
  }
  if (setup.neighbors < 1 || setup.neighbors > n - 1 || (setup.neighbors < n - 1 && setup.neighbors % 2 != 0)) {
    return InvalidArgumentError("neighbors must be even and 2 to " + std::to_string(n - 1) + ", or " +
                                std::to_string(n - 1) + " (all)");
  }
  if (setup.share_threshold != ShareThreshold(n, setup.min_survivors, setup.neighbors)) {
    return InvalidArgumentError("share_threshold must be " +
                                std::to_string(ShareThreshold(n, setup.min_survivors, setup.neighbors)) +
                                " for this threshold and graph");
  }
  PARSYN_ASSIGN_OR_RETURN(const int ring_bits, RingBits(setup.quantization_bits, n));
  if (setup.ring_bits != ring_bits) {
    return InvalidArgumentError("ring_bits must be " + std::to_string(ring_bits) + " for " + std::to_string(n) +
                                " updates of " + std::to_string(setup.quantization_bits) + " bits");
  }
  if (!(setup.clipping_range > 0) || !std::isfinite(setup.clipping_range)) {
    return InvalidArgumentError("clipping_range must be a positive number");
  }
  if (setup.vector_length < 2) return InvalidArgumentError("vector_length must be at least 2 (a value and the weight)");
  return Status::Ok();
}

namespace {

// The neighbors of the worker at `at` in the graph's order.
std::vector<uint64_t> NeighborsAt(const RoundSetup& setup, const std::vector<uint64_t>& order, size_t at) {
  const size_t n = order.size();
  std::vector<uint64_t> out;
  if (setup.neighbors >= n - 1) {
    for (uint64_t id : setup.participants) {
      if (id != order[at]) out.push_back(id);
    }
    return out;
  }
  for (size_t step = 1; step <= setup.neighbors / 2; ++step) {
    out.push_back(order[(at + step) % n]);
    out.push_back(order[(at + n - step) % n]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<uint64_t> Neighbors(const RoundSetup& setup, uint64_t worker) {
  if (!IsParticipant(setup, worker)) return {};
  const std::vector<uint64_t> order = RingOrder(setup);
  return NeighborsAt(setup, order, static_cast<size_t>(std::find(order.begin(), order.end(), worker) - order.begin()));
}

std::map<uint64_t, std::vector<uint64_t>> AllNeighbors(const RoundSetup& setup) {
  const std::vector<uint64_t> order = RingOrder(setup);
  std::map<uint64_t, std::vector<uint64_t>> out;
  for (size_t at = 0; at < order.size(); ++at) out[order[at]] = NeighborsAt(setup, order, at);
  return out;
}

uint32_t SharePoint(const RoundSetup& setup, uint64_t worker) {
  const auto it = std::lower_bound(setup.participants.begin(), setup.participants.end(), worker);
  return static_cast<uint32_t>(it - setup.participants.begin()) + 1;
}

bool IsParticipant(const RoundSetup& setup, uint64_t worker) {
  return std::binary_search(setup.participants.begin(), setup.participants.end(), worker);
}

}  // namespace parsyn::secagg
