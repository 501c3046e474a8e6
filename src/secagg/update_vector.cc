#include "secagg/update_vector.h"

#include <cmath>
#include <cstring>
#include <string>

#include "secagg/ring.h"

namespace parsyn::secagg {

size_t UpdateVectorLength(const weights::WeightSet& global) {
  size_t length = 0;
  for (const weights::Tensor& t : global.tensors()) {
    if (weights::IsFloat(t.dtype)) length += static_cast<size_t>(t.numel());
  }
  return length;
}

namespace {

Status CheckChangeLength(const weights::WeightSet& global, std::span<const float> change) {
  if (change.size() == UpdateVectorLength(global)) return Status::Ok();
  return InvalidArgumentError("a change of " + std::to_string(change.size()) + " values for a global of " +
                              std::to_string(UpdateVectorLength(global)) + " exchanged values");
}

}  // namespace

StatusOr<std::vector<float>> UpdateVector(const weights::WeightSet& global, const weights::WeightSet& trained) {
  PARSYN_RETURN_IF_ERROR(global.CheckSameLayout(trained));
  std::vector<float> out;
  out.reserve(UpdateVectorLength(global));
  for (size_t k = 0; k < global.tensors().size(); ++k) {
    const weights::Tensor& g = global[k];
    const weights::Tensor& t = trained[k];
    if (!weights::IsFloat(g.dtype)) {
      if (g.data.size() != t.data.size() || std::memcmp(g.data.data(), t.data.data(), g.data.size()) != 0) {
        return InvalidArgumentError("tensor '" + g.name + "' is not exchanged (" +
                                    std::string(weights::DTypeName(g.dtype)) + "), and the update changed it");
      }
      continue;
    }
    for (int64_t i = 0; i < g.numel(); ++i) {
      const float change = static_cast<float>(weights::LoadElement(t, i) - weights::LoadElement(g, i));
      if (!std::isfinite(change)) {
        return InvalidArgumentError("tensor '" + g.name + "' has a non-finite change at index " + std::to_string(i));
      }
      out.push_back(change);
    }
  }
  return out;
}

StatusOr<weights::WeightSet> ApplyUpdateVector(const weights::WeightSet& global, std::span<const float> change) {
  PARSYN_RETURN_IF_ERROR(CheckChangeLength(global, change));
  weights::WeightSet out;
  size_t at = 0;
  for (const weights::Tensor& g : global.tensors()) {
    PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes, out.AddZeros(g.name, g.dtype, g.shape));
    if (!weights::IsFloat(g.dtype)) {
      std::memcpy(bytes.data(), g.data.data(), bytes.size());
      continue;
    }
    const weights::Tensor& made = out.tensors().back();
    for (int64_t i = 0; i < g.numel(); ++i) {
      weights::StoreElement(made, i, weights::LoadElement(g, i) + static_cast<double>(change[at++]));
    }
  }
  out.metadata() = global.metadata();
  return out;
}

StatusOr<std::vector<uint32_t>> QuantizedUpdate(const weights::WeightSet& global, const weights::WeightSet& trained,
                                                int64_t samples, int64_t sample_bound, const Quantization& quantization,
                                                const Key32& rounding_key) {
  if (sample_bound < 1 || samples < 1 || samples > sample_bound) {
    return InvalidArgumentError("a sample count of " + std::to_string(samples) + " is outside 1.." +
                                std::to_string(sample_bound) + ", the round's bound");
  }
  PARSYN_ASSIGN_OR_RETURN(const std::vector<float> change, UpdateVector(global, trained));
  const double weight = static_cast<double>(samples) / static_cast<double>(sample_bound);
  return QuantizeUpdate(change, weight, quantization, rounding_key);
}

StatusOr<std::vector<uint32_t>> NoisedQuantizedUpdate(const weights::WeightSet& global,
                                                      const weights::WeightSet& trained, const DistributedNoise& noise,
                                                      const Quantization& quantization, const Key32& rounding_key,
                                                      const Key32& noise_key) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<float> change, UpdateVector(global, trained));
  PARSYN_RETURN_IF_ERROR(ClipAndAddNoise(change, noise.clip_norm, noise.noise_stddev, noise_key));
  return QuantizeUpdate(change, 1.0, quantization, rounding_key);
}

StatusOr<std::vector<uint32_t>> QuantizedInput(const weights::WeightSet& global, const weights::WeightSet& trained,
                                               int64_t samples, const InputRule& rule, const Quantization& quantization,
                                               const Key32& rounding_key, const Key32& noise_key) {
  if (rule.noise) return NoisedQuantizedUpdate(global, trained, *rule.noise, quantization, rounding_key, noise_key);
  return QuantizedUpdate(global, trained, samples, rule.sample_bound, quantization, rounding_key);
}

StatusOr<std::string> MaskedUpdate(Client& client, std::span<const SealedShare> received,
                                   const weights::WeightSet& global, const weights::WeightSet& trained, int64_t samples,
                                   const InputRule& rule) {
  const RoundSetup& setup = client.setup();
  PARSYN_ASSIGN_OR_RETURN(const Key32 rounding_key, RandomKey());
  PARSYN_ASSIGN_OR_RETURN(const Key32 noise_key, RandomKey());
  PARSYN_ASSIGN_OR_RETURN(std::vector<uint32_t> quantized,
                          QuantizedInput(global, trained, samples, rule,
                                         {setup.quantization_bits, setup.clipping_range}, rounding_key, noise_key));
  PARSYN_ASSIGN_OR_RETURN(std::vector<uint32_t> masked, client.MaskInput(received, std::move(quantized)));
  return PackRing(masked, setup.ring_bits);
}

StatusOr<weights::WeightSet> UpdateVectorAsDelta(const weights::WeightSet& global, std::span<const float> change) {
  PARSYN_RETURN_IF_ERROR(CheckChangeLength(global, change));
  weights::WeightSet out;
  size_t at = 0;
  for (const weights::Tensor& g : global.tensors()) {
    if (!weights::IsFloat(g.dtype)) continue;
    PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes, out.AddZeros(g.name, weights::DType::kF32, g.shape));
    const size_t n = static_cast<size_t>(g.numel());
    std::memcpy(bytes.data(), change.data() + at, n * sizeof(float));
    at += n;
  }
  return out;
}

StatusOr<SecureMean> MeanFromSecureSum(const weights::WeightSet& global, std::span<const uint32_t> sum,
                                       size_t survivors, int64_t sample_bound, const Quantization& quantization,
                                       SecureMeanForm form) {
  if (sum.size() != UpdateVectorLength(global) + 1) {
    return InvalidArgumentError("a secure sum of " + std::to_string(sum.size()) + " elements for a global of " +
                                std::to_string(UpdateVectorLength(global)) + " exchanged values (and the weight)");
  }
  PARSYN_ASSIGN_OR_RETURN(DequantizedMean mean, DequantizeMean(sum, survivors, quantization));
  SecureMean out;
  out.total_samples = mean.weight_sum * static_cast<double>(sample_bound);
  // Each weight is at most 1 plus a rounding step; the sum of `survivors` weights, at most `survivors` of them.
  if (mean.weight_sum > static_cast<double>(survivors) * (1 + 1e-6)) {
    return InvalidArgumentError("the survivors' weights add up to " + std::to_string(mean.weight_sum) + ", above " +
                                std::to_string(survivors) + " (a sample count above the round's bound)");
  }
  if (form == SecureMeanForm::kDelta) {
    PARSYN_ASSIGN_OR_RETURN(out.weights, UpdateVectorAsDelta(global, mean.mean));
  } else {
    PARSYN_ASSIGN_OR_RETURN(out.weights, ApplyUpdateVector(global, mean.mean));
  }
  return out;
}

}  // namespace parsyn::secagg
