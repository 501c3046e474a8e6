#include "secagg/quantization.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "weights/keyed_stream.h"

namespace parsyn::secagg {
namespace {

constexpr uint32_t kRoundingDomain = 0x53415231;  // "SAR1"
constexpr uint32_t kNoiseDomain = 0x53414e31;     // "SAN1"

Status CheckQuantization(const Quantization& q) {
  if (q.bits != 8 && q.bits != 16) return InvalidArgumentError("quantization_bits is 8 or 16");
  if (!(q.clipping_range > 0) || !std::isfinite(q.clipping_range)) {
    return InvalidArgumentError("clipping_range must be a positive number");
  }
  return Status::Ok();
}

// A uniform double in [0, 1) from 53 bits of the stream.
double Uniform(weights::KeyedStream& stream) { return static_cast<double>(stream.Next() >> 11) * 0x1.0p-53; }

uint32_t RoundStochastically(double level, double levels, weights::KeyedStream& stream) {
  const double rounded = std::floor(level + Uniform(stream));
  return static_cast<uint32_t>(std::clamp(rounded, 0.0, levels));
}

}  // namespace

StatusOr<std::vector<uint32_t>> QuantizeUpdate(std::span<const float> values, double weight,
                                               const Quantization& quantization, const Key32& rounding_key) {
  PARSYN_RETURN_IF_ERROR(CheckQuantization(quantization));
  if (!(weight > 0 && weight <= 1)) {
    return InvalidArgumentError("an update's weight (its sample count over the round's bound) must be in (0, 1], not " +
                                std::to_string(weight));
  }
  const double c = quantization.clipping_range;
  const double levels = std::ldexp(1.0, quantization.bits) - 1;
  weights::KeyedStream stream(rounding_key, kRoundingDomain, 0);
  std::vector<uint32_t> out(values.size() + 1);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return InvalidArgumentError("element " + std::to_string(i) + " of the update is not finite");
    }
    const double scaled = weight * std::clamp(static_cast<double>(values[i]), -c, c);
    out[i] = RoundStochastically((scaled + c) / (2 * c) * levels, levels, stream);
  }
  out.back() = RoundStochastically(weight * levels, levels, stream);
  return out;
}

Status ClipAndAddNoise(std::span<float> change, double clip_norm, double noise_stddev, const Key32& noise_key) {
  if (!(clip_norm > 0) || !std::isfinite(clip_norm) || !(noise_stddev >= 0) || !std::isfinite(noise_stddev)) {
    return InvalidArgumentError("the clipping norm must be positive and the noise's standard deviation at least 0");
  }
  double norm_sq = 0;
  for (float v : change) norm_sq += static_cast<double>(v) * v;
  if (!std::isfinite(norm_sq)) return InvalidArgumentError("the change is not finite");
  const double scale = std::min(1.0, clip_norm / std::sqrt(norm_sq));
  weights::GaussianStream noise(noise_key, kNoiseDomain, 0);
  for (float& v : change) v = static_cast<float>(v * scale + noise_stddev * noise.Next());
  return Status::Ok();
}

double WorkerNoiseStddev(double noise_multiplier, double clip_norm, size_t min_survivors) {
  return noise_multiplier * clip_norm / std::sqrt(static_cast<double>(std::max<size_t>(min_survivors, 1)));
}

StatusOr<DequantizedMean> DequantizeMean(std::span<const uint32_t> sum, size_t contributors,
                                         const Quantization& quantization) {
  PARSYN_RETURN_IF_ERROR(CheckQuantization(quantization));
  if (sum.empty() || contributors == 0) return InvalidArgumentError("an empty sum has no mean");
  const double c = quantization.clipping_range;
  const double levels = std::ldexp(1.0, quantization.bits) - 1;
  const double largest = static_cast<double>(contributors) * levels;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i] > largest) {
      return InvalidArgumentError("element " + std::to_string(i) + " of the unmasked sum is " + std::to_string(sum[i]) +
                                  ", above what " + std::to_string(contributors) +
                                  " quantized updates can add up to: a worker sent something else");
    }
  }
  DequantizedMean result;
  result.weight_sum = sum.back() / levels;
  if (!(result.weight_sum > 0)) return InvalidArgumentError("the unmasked weights add up to zero");
  result.mean.resize(sum.size() - 1);
  const double step = 2 * c / levels, offset = static_cast<double>(contributors) * c;
  for (size_t i = 0; i + 1 < sum.size(); ++i) {
    result.mean[i] = static_cast<float>((sum[i] * step - offset) / result.weight_sum);
  }
  return result;
}

}  // namespace parsyn::secagg
