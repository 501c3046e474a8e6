// What every party of one secure-aggregation attempt agrees on, and the masking graph it implies (SecAgg+, Bell et
// al. 2020): each worker masks against its `neighbors` nearest workers on a ring of the participants in an order drawn
// from the attempt's graph seed (a Harary graph with random labels; the complete graph when neighbors = n - 1), and
// shares its secrets among them and itself. The coordinator makes a setup per attempt; each worker checks the one it
// is sent, since a coordinator that lowers thresholds could learn single updates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "secagg/crypto.h"

namespace parsyn::secagg {

struct RoundSetup {
  std::string attempt;                 // unique per attempt; bound into every key, signature and share
  std::vector<uint64_t> participants;  // worker ids, ascending, distinct
  size_t min_survivors = 0;            // fewer live workers after any phase fail the attempt
  size_t neighbors = 0;                // each worker's degree in the masking graph (participants - 1: all)
  size_t share_threshold = 0;          // shares that rebuild a worker's secret, among its neighbors and itself
  int quantization_bits = 16;          // 8 or 16
  int ring_bits = 32;                  // RingBits(quantization_bits, participants)
  double clipping_range = 8.0;
  size_t vector_length = 0;  // elements of a quantized update: the parameters and the weight
  Key32 graph_seed{};
  bool operator==(const RoundSetup&) const = default;
};

// ceil(2n/3), the default threshold.
size_t DefaultThreshold(size_t participants);
// n - 1 (all) for n <= 16, else ceil(3 log2 n) rounded up to even, at most n - 1.
size_t DefaultNeighbors(size_t participants);

// A setup for `participants` (any order; sorted here). The share threshold is the larger of a majority of a
// secret's holders (so that no coordinator gets both secrets of a worker from honest holders) and min_survivors'
// share of them, ceil(min_survivors (k + 1) / n). InvalidArgument naming the field for a threshold outside
// 2..n (a sum of one input is that input), fewer than 2 participants, bits other than 8 or 16, or an empty vector.
StatusOr<RoundSetup> MakeRoundSetup(std::string attempt, std::vector<uint64_t> participants, size_t min_survivors,
                                    size_t neighbors, int quantization_bits, double clipping_range,
                                    size_t vector_length, const Key32& graph_seed);

// What a worker checks of a setup it is sent: everything MakeRoundSetup would have made, so a setup whose
// thresholds were lowered is refused (InvalidArgument naming the field).
Status CheckRoundSetup(const RoundSetup& setup);

// The worker's neighbors in the masking graph, ascending; empty for a worker not in the setup.
std::vector<uint64_t> Neighbors(const RoundSetup& setup, uint64_t worker);
// Every participant's neighbors, from one pass over the graph's order (the coordinator's view; Neighbors for each would
// draw the order n times).
std::map<uint64_t, std::vector<uint64_t>> AllNeighbors(const RoundSetup& setup);

// The worker's point for its shares: its place among the participants, from 1.
uint32_t SharePoint(const RoundSetup& setup, uint64_t worker);

bool IsParticipant(const RoundSetup& setup, uint64_t worker);

}  // namespace parsyn::secagg
