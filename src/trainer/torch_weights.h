// Conversions between weights::WeightSet tensors and torch tensors, for every model of the trainer.
// Safe to call from several threads at once on distinct tensors.
#pragma once

#include <torch/torch.h>

#include <string>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

// The torch dtype of a weights dtype (all ten have one).
torch::Dtype ToTorchDtype(weights::DType dtype);
// InvalidArgument for torch dtypes a safetensors file cannot hold (complex, quantized, ...).
StatusOr<weights::DType> FromTorchDtype(torch::Dtype dtype);

// A CPU torch tensor holding a copy of `tensor`'s bytes, in the tensor's own dtype.
torch::Tensor ToTorch(const weights::Tensor& tensor);

// Appends `value` (any device; converted to `dtype`) to `set` under `name`. Errors of WeightSet::Add; throws
// c10::Error only if torch fails to copy the tensor off its device (callers catch at their edge).
Status AppendToWeightSet(weights::WeightSet& set, std::string name, const torch::Tensor& value, weights::DType dtype);

}  // namespace parsyn::trainer
