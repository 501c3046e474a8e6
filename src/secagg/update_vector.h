// A worker's update as the flat vector secure aggregation quantizes, and the mean of such vectors back into weights.
//
// The vector is the change a worker made in a round: trained - global, element by element, over the global's float
// tensors (F32, BF16, F16, F64) in the global's order, as fp32. Quantizing the change rather than the weights keeps
// the quantization step (2c / (2^bits - 1)) relative to what a round moves; FedAvg of the weights is the global plus
// FedAvg of the changes, since the weights of the mean add up to 1. Other tensors are not exchanged and must be equal.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "base/status.h"
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

}  // namespace parsyn::secagg
