// A worker's update as the flat vector secure aggregation quantizes, and the mean of such vectors back into weights.
//
// The vector is the change a worker made in a round: trained - global, element by element, over the global's float
// tensors (F32, BF16, F16, F64) in the global's order, as fp32. Quantizing the change rather than the weights keeps
// the quantization step (2c / (2^bits - 1)) relative to what a round moves; FedAvg of the weights is the global plus
// FedAvg of the changes, since the weights of the mean add up to 1. Other tensors are not exchanged and must be equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
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

struct SecureMean {
  weights::WeightSet weights;  // the global plus the mean change, in the global's dtypes
  double total_samples = 0;    // the survivors' samples as the sum's weights give them (up to quantization)
};

// The round's new weights from the unmasked sum of `survivors` quantized updates: the global plus their mean change
// weighted by sample count, with DequantizeMean's checks, and the round's sample total, which must not exceed
// survivors x sample_bound (InvalidArgument otherwise: the weights were not what workers may send).
StatusOr<SecureMean> MeanFromSecureSum(const weights::WeightSet& global, std::span<const uint32_t> sum,
                                       size_t survivors, int64_t sample_bound, const Quantization& quantization);

}  // namespace parsyn::secagg
