// How an update becomes integers a secure sum can add, and the sum back into the weighted mean (FedAvg by sample
// count without the coordinator seeing a single update).
//
// A worker with weight w in (0, 1] (its sample count over the round's declared bound) clips each value x of its
// update to [-c, c], scales it by w, and rounds w * x stochastically onto the L + 1 levels of [-c, c] (L = 2^bits - 1):
// q = floor((w * x + c) / (2c) * L + u), u uniform in [0, 1), so that E[q] is exact. One more element carries w itself
// on the levels of [0, 1]. The sum of n such vectors gives back sum(w_i x_i) and sum(w_i), and their ratio is the
// mean weighted by sample count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "secagg/crypto.h"

namespace parsyn::secagg {

struct Quantization {
  int bits = 16;                // 8 or 16
  double clipping_range = 8.0;  // c
};

// The update's values and its weight, as len + 1 integers of `bits` bits (the weight last). `rounding_key` seeds the
// stochastic rounding (a fresh random key per update). InvalidArgument for a weight outside (0, 1], a clipping range
// that is not positive and finite, or a value that is not finite.
StatusOr<std::vector<uint32_t>> QuantizeUpdate(std::span<const float> values, double weight,
                                               const Quantization& quantization, const Key32& rounding_key);

// Distributed differential privacy (dp_fedavg under secure aggregation, where the coordinator cannot clip or add
// noise to what it never sees): scales `change` down to an L2 norm of at most `clip_norm`, then adds to each value a
// normal draw of standard deviation `noise_stddev` under `noise_key` (a fresh key of the worker's own: no one else may
// know its noise). With noise_stddev = sigma C / sqrt(K) for a round of K workers, the sum of their noise has the
// standard deviation sigma C that dp_fedavg adds centrally (if all K are summed; with s survivors it is
// sigma C sqrt(s / K), which the accountant must be told). InvalidArgument for a norm or stddev that is negative or not
// finite, or a change that is not finite.
Status ClipAndAddNoise(std::span<float> change, double clip_norm, double noise_stddev, const Key32& noise_key);

// dp_fedavg under secure aggregation: what each worker of an attempt does to its change before quantizing it.
struct DistributedNoise {
  double clip_norm = 0;     // C
  double noise_stddev = 0;  // per value, WorkerNoiseStddev
  bool operator==(const DistributedNoise&) const = default;
};
// sigma C / sqrt(t), t the attempt's least number of survivors: the noise of any s >= t summed workers has the
// standard deviation sigma C sqrt(s / t) >= sigma C, at least what dp_fedavg adds centrally and its accountant counts.
double WorkerNoiseStddev(double noise_multiplier, double clip_norm, size_t min_survivors);

struct DequantizedMean {
  std::vector<float> mean;  // sum(w_i x_i) / sum(w_i), one value per element but the last
  double weight_sum = 0;    // sum(w_i)
};

// The unmasked sum of `contributors` quantized updates, back to their weighted mean. It checks what the coordinator
// still can: every element at most contributors * L (else the inputs were not quantized updates: InvalidArgument
// naming the element), a positive weight sum, finite values.
StatusOr<DequantizedMean> DequantizeMean(std::span<const uint32_t> sum, size_t contributors,
                                         const Quantization& quantization);

}  // namespace parsyn::secagg
