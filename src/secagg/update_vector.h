// A worker's update as the flat vector secure aggregation quantizes, and the mean of such vectors back into weights.
//
// The vector is the change a worker made in a round: trained - global, element by element, over the global's float
// tensors (F32, BF16, F16, F64) in the global's order, as fp32. Quantizing the change rather than the weights keeps
// the quantization step (2c / (2^bits - 1)) relative to what a round moves; FedAvg of the weights is the global plus
// FedAvg of the changes, since the weights of the mean add up to 1. Other tensors are not exchanged and must be equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "secagg/client.h"
#include "secagg/crypto.h"
#include "secagg/quantization.h"
#include "weights/weight_set.h"

namespace parsyn::secagg {

// The number of elements of the global's float tensors: an update vector's length (the quantized vector has one
// more, the weight).
size_t UpdateVectorLength(const weights::WeightSet& global);

// trained - global over the float tensors. InvalidArgument (CheckSameLayout's message) for another layout, or naming
// a tensor whose other values differ, or whose change is not finite.
StatusOr<std::vector<float>> UpdateVector(const weights::WeightSet& global, const weights::WeightSet& trained);

// global + change, in the global's dtypes (rounded as StoreElement rounds); other tensors copied. InvalidArgument
// when `change` is not UpdateVectorLength(global) long.
StatusOr<weights::WeightSet> ApplyUpdateVector(const weights::WeightSet& global, std::span<const float> change);

// What a worker sends into the secure sum: its change from the global, quantized with the weight samples /
// sample_bound (the round's declared bound on any worker's sample count). InvalidArgument for a sample count outside
// 1..sample_bound, or what UpdateVector and QuantizeUpdate refuse. `rounding_key`: a fresh random key.
StatusOr<std::vector<uint32_t>> QuantizedUpdate(const weights::WeightSet& global, const weights::WeightSet& trained,
                                                int64_t samples, int64_t sample_bound, const Quantization& quantization,
                                                const Key32& rounding_key);

// What a dp_fedavg worker sends into the secure sum (distributed DP): its change from the global clipped and noised
// (ClipAndAddNoise under `noise_key`, a fresh random key no one else knows), quantized with weight 1, since dp_fedavg's
// mean is unweighted. What UpdateVector, ClipAndAddNoise and QuantizeUpdate refuse.
StatusOr<std::vector<uint32_t>> NoisedQuantizedUpdate(const weights::WeightSet& global,
                                                      const weights::WeightSet& trained, const DistributedNoise& noise,
                                                      const Quantization& quantization, const Key32& rounding_key,
                                                      const Key32& noise_key);

// How every worker of an attempt turns its update into its quantized input (the coordinator sends it with the setup).
struct InputRule {
  int64_t sample_bound = 1;               // FedAvg by sample count: the weight is samples / sample_bound
  std::optional<DistributedNoise> noise;  // dp_fedavg: the change clipped and noised, weight 1 (sample_bound 1)
};
// The worker's input under `rule`: NoisedQuantizedUpdate when rule.noise is set, else QuantizedUpdate.
StatusOr<std::vector<uint32_t>> QuantizedInput(const weights::WeightSet& global, const weights::WeightSet& trained,
                                               int64_t samples, const InputRule& rule, const Quantization& quantization,
                                               const Key32& rounding_key, const Key32& noise_key);

// A worker's phase-3 message: its QuantizedInput under `rule` (fresh rounding and noise keys), masked by `client`
// with the shares it received (Client::MaskInput), packed at the setup's ring width (PackRing).
StatusOr<std::string> MaskedUpdate(Client& client, std::span<const SealedShare> received,
                                   const weights::WeightSet& global, const weights::WeightSet& trained, int64_t samples,
                                   const InputRule& rule);

// The mean change as float32 tensors named and shaped as the global's float tensors: the mean delta dp_fedavg
// finishes from (its globals are all floats). InvalidArgument as ApplyUpdateVector.
StatusOr<weights::WeightSet> UpdateVectorAsDelta(const weights::WeightSet& global, std::span<const float> change);

// What the strategy finishes a secure round from: the new weights (global + the mean change), or the mean change
// itself (a strategy that transforms updates into deltas: dp_fedavg).
enum class SecureMeanForm { kWeights, kDelta };

struct SecureMean {
  weights::WeightSet weights;  // as SecureMeanForm asked, in the global's layout
  double total_samples = 0;    // the survivors' samples as the sum's weights give them (up to quantization)
};

// The round's mean from the unmasked sum of `survivors` quantized updates: their mean change weighted as the workers
// weighted it, with DequantizeMean's checks, and the round's sample total, which must not exceed survivors x
// sample_bound (InvalidArgument otherwise: the weights were not what workers may send; for unweighted updates
// sample_bound is 1 and the total counts the survivors).
StatusOr<SecureMean> MeanFromSecureSum(const weights::WeightSet& global, std::span<const uint32_t> sum,
                                       size_t survivors, int64_t sample_bound, const Quantization& quantization,
                                       SecureMeanForm form = SecureMeanForm::kWeights);

}  // namespace parsyn::secagg
