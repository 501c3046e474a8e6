#include "trainer/torch_weights.h"

namespace parsyn::trainer {

torch::Dtype ToTorchDtype(weights::DType dtype) {
  switch (dtype) {
    case weights::DType::kF32: return torch::kFloat32;
    case weights::DType::kF16: return torch::kFloat16;
    case weights::DType::kBF16: return torch::kBFloat16;
    case weights::DType::kF64: return torch::kFloat64;
    case weights::DType::kI64: return torch::kInt64;
    case weights::DType::kI32: return torch::kInt32;
    case weights::DType::kI16: return torch::kInt16;
    case weights::DType::kI8: return torch::kInt8;
    case weights::DType::kU8: return torch::kUInt8;
    case weights::DType::kBool: return torch::kBool;
  }
  return torch::kFloat32;
}

StatusOr<weights::DType> FromTorchDtype(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32: return weights::DType::kF32;
    case torch::kFloat16: return weights::DType::kF16;
    case torch::kBFloat16: return weights::DType::kBF16;
    case torch::kFloat64: return weights::DType::kF64;
    case torch::kInt64: return weights::DType::kI64;
    case torch::kInt32: return weights::DType::kI32;
    case torch::kInt16: return weights::DType::kI16;
    case torch::kInt8: return weights::DType::kI8;
    case torch::kUInt8: return weights::DType::kU8;
    case torch::kBool: return weights::DType::kBool;
    default:
      return InvalidArgumentError(std::string("torch dtype ") + c10::toString(dtype) +
                                  " has no safetensors equivalent");
  }
}

torch::Tensor ToTorch(const weights::Tensor& tensor) {
  const auto options = torch::TensorOptions().dtype(ToTorchDtype(tensor.dtype));
  if (tensor.data.empty()) return torch::empty(tensor.shape, options);
  // from_blob only borrows the bytes (which may be a read-only mapping); clone() makes the tensor own a copy.
  return torch::from_blob(tensor.data.data(), tensor.shape, options).clone();
}

Status AppendToWeightSet(weights::WeightSet& set, std::string name, const torch::Tensor& value, weights::DType dtype) {
  torch::Tensor cpu = value.detach().to(torch::kCPU, ToTorchDtype(dtype)).contiguous();
  std::vector<int64_t> shape(cpu.sizes().begin(), cpu.sizes().end());
  const auto* bytes = static_cast<const std::byte*>(cpu.data_ptr());
  return set.Add(std::move(name), dtype, std::move(shape),
                 std::span<const std::byte>(bytes, static_cast<size_t>(cpu.nbytes())));
}

}  // namespace parsyn::trainer
