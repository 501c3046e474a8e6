#include "secagg/ring.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "weights/keyed_stream.h"

namespace parsyn::secagg {
namespace {

constexpr uint32_t kMaskDomain = 0x53414d31;  // "SAM1": the keystream domain of secure aggregation's masks
constexpr size_t kMaskChunk = 16384;          // elements per keystream piece

}  // namespace

StatusOr<int> RingBits(int quantization_bits, size_t contributors) {
  if (quantization_bits != 8 && quantization_bits != 16) {
    return InvalidArgumentError("quantization_bits is 8 or 16, not " + std::to_string(quantization_bits));
  }
  const uint64_t largest_sum = static_cast<uint64_t>(contributors) * ((uint64_t{1} << quantization_bits) - 1);
  if (largest_sum <= 0xffff) return 16;
  if (largest_sum <= 0xffffffffULL) return 32;
  return InvalidArgumentError("the sum of " + std::to_string(contributors) + " updates of " +
                              std::to_string(quantization_bits) + " bits does not fit 32 bits");
}

void ApplyMask(const Key32& seed, int sign, int ring_bits, uint64_t first_element, std::span<uint32_t> values) {
  const size_t width = static_cast<size_t>(ring_bits / 8);
  const uint32_t mask = RingMask(ring_bits);
  std::vector<unsigned char> stream(kMaskChunk * width);
  for (size_t begin = 0; begin < values.size(); begin += kMaskChunk) {
    const size_t count = std::min(kMaskChunk, values.size() - begin);
    const std::span<unsigned char> piece(stream.data(), count * width);
    weights::FillKeystream(seed, kMaskDomain, 0, (first_element + begin) * width, piece);
    uint32_t* out = values.data() + begin;
    if (width == 2) {
      for (size_t i = 0; i < count; ++i) {
        const uint32_t word = piece[2 * i] | (uint32_t{piece[2 * i + 1]} << 8);
        out[i] = (sign > 0 ? out[i] + word : out[i] - word) & mask;
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        const uint32_t word = piece[4 * i] | (uint32_t{piece[4 * i + 1]} << 8) | (uint32_t{piece[4 * i + 2]} << 16) |
                              (uint32_t{piece[4 * i + 3]} << 24);
        out[i] = (sign > 0 ? out[i] + word : out[i] - word) & mask;
      }
    }
  }
}

void ApplyMasks(std::span<const SignedSeed> masks, int ring_bits, std::span<uint32_t> values) {
  constexpr size_t kRangeElements = size_t{1} << 20;
  const size_t ranges = (values.size() + kRangeElements - 1) / kRangeElements;
  const size_t threads = std::min<size_t>(ranges, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next_range{0};
  auto work = [&] {
    for (size_t r = next_range++; r < ranges; r = next_range++) {
      const size_t begin = r * kRangeElements;
      const std::span<uint32_t> range = values.subspan(begin, std::min(kRangeElements, values.size() - begin));
      for (const SignedSeed& mask : masks) ApplyMask(mask.seed, mask.sign, ring_bits, begin, range);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

void AddInto(std::span<uint32_t> values, std::span<const uint32_t> other, int ring_bits) {
  const uint32_t mask = RingMask(ring_bits);
  for (size_t i = 0; i < values.size(); ++i) values[i] = (values[i] + other[i]) & mask;
}

std::string PackRing(std::span<const uint32_t> values, int ring_bits) {
  const size_t width = static_cast<size_t>(ring_bits / 8);
  std::string out(values.size() * width, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t b = 0; b < width; ++b) out[i * width + b] = static_cast<char>((values[i] >> (8 * b)) & 0xff);
  }
  return out;
}

StatusOr<std::vector<uint32_t>> UnpackRing(std::string_view bytes, int ring_bits, size_t elements) {
  const size_t width = static_cast<size_t>(ring_bits / 8);
  if (bytes.size() != elements * width) {
    return InvalidArgumentError("a masked vector of " + std::to_string(elements) + " elements of " +
                                std::to_string(ring_bits) + " bits is " + std::to_string(elements * width) +
                                " bytes, not " + std::to_string(bytes.size()));
  }
  std::vector<uint32_t> out(elements);
  for (size_t i = 0; i < elements; ++i) {
    uint32_t v = 0;
    for (size_t b = width; b > 0; --b) v = (v << 8) | static_cast<unsigned char>(bytes[i * width + b - 1]);
    out[i] = v;
  }
  return out;
}

}  // namespace parsyn::secagg
