#include "secagg/ring.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

namespace parsyn::secagg {
namespace {

constexpr size_t kMaskChunk = 16384;  // elements per keystream piece
constexpr uint64_t kAesBlockBytes = 16;

static_assert(std::endian::native == std::endian::little, "masks are read as little-endian words");

struct CipherContextFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};

// AES-256-CTR, fetched once (an implicit fetch per use costs more than a small piece of keystream).
const EVP_CIPHER* AesCtr() {
  static EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-CTR", nullptr);
  if (cipher == nullptr) std::abort();  // OpenSSL without AES: nothing here can work
  return cipher;
}

// Bytes [first_byte, first_byte + out.size()) of the mask stream of `seed`: AES-256-CTR under the seed, counter
// from zero, encrypting zeros. Each seed masks one vector, so no counter block is used twice under a key.
void FillMaskStream(EVP_CIPHER_CTX* ctx, const Key32& seed, uint64_t first_byte, std::span<unsigned char> out) {
  unsigned char iv[kAesBlockBytes] = {};
  const uint64_t block = first_byte / kAesBlockBytes;
  for (int i = 0; i < 8; ++i) iv[15 - i] = static_cast<unsigned char>(block >> (8 * i));  // a big-endian counter
  int ok = EVP_EncryptInit_ex(ctx, AesCtr(), nullptr, seed.data(), iv);
  int written = 0;
  unsigned char skipped[kAesBlockBytes] = {};
  const int skip = static_cast<int>(first_byte % kAesBlockBytes);
  if (skip > 0) ok = ok && EVP_EncryptUpdate(ctx, skipped, &written, skipped, skip);
  std::memset(out.data(), 0, out.size());
  ok = ok && EVP_EncryptUpdate(ctx, out.data(), &written, out.data(), static_cast<int>(out.size()));
  if (!ok) std::abort();  // fails only when OpenSSL cannot allocate
}

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
  std::unique_ptr<EVP_CIPHER_CTX, CipherContextFree> ctx(EVP_CIPHER_CTX_new());
  if (!ctx) std::abort();
  std::vector<unsigned char> stream(kMaskChunk * width);
  for (size_t begin = 0; begin < values.size(); begin += kMaskChunk) {
    const size_t count = std::min(kMaskChunk, values.size() - begin);
    const std::span<unsigned char> piece(stream.data(), count * width);
    FillMaskStream(ctx.get(), seed, (first_element + begin) * width, piece);
    uint32_t* out = values.data() + begin;
    if (width == 2) {
      for (size_t i = 0; i < count; ++i) {
        uint16_t word;
        std::memcpy(&word, piece.data() + 2 * i, 2);
        out[i] = (sign > 0 ? out[i] + word : out[i] - word) & mask;
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        uint32_t word;
        std::memcpy(&word, piece.data() + 4 * i, 4);
        out[i] = sign > 0 ? out[i] + word : out[i] - word;
      }
    }
  }
}

namespace {

// Runs work(begin, count) over [0, size) in ranges of `range_elements`, on up to one thread per core.
template <typename Work>
void ForEachRange(size_t size, size_t range_elements, const Work& work) {
  const size_t ranges = (size + range_elements - 1) / range_elements;
  const size_t threads = std::min<size_t>(ranges, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next_range{0};
  auto run = [&] {
    for (size_t r = next_range++; r < ranges; r = next_range++) {
      const size_t begin = r * range_elements;
      work(begin, std::min(range_elements, size - begin));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(run);
  run();
  for (std::thread& thread : pool) thread.join();
}

}  // namespace

void ApplyMasks(std::span<const SignedSeed> masks, int ring_bits, std::span<uint32_t> values) {
  // A range (512 KiB of 32-bit words) stays in L2 while every mask is added to it; many ranges keep all threads busy.
  ForEachRange(values.size(), size_t{1} << 17, [&](size_t begin, size_t count) {
    for (const SignedSeed& mask : masks)
      ApplyMask(mask.seed, mask.sign, ring_bits, begin, values.subspan(begin, count));
  });
}

Status AddPacked(std::span<uint32_t> values, std::string_view packed, int ring_bits) {
  const size_t width = static_cast<size_t>(ring_bits / 8);
  if (packed.size() != values.size() * width) {
    return InvalidArgumentError("a vector of " + std::to_string(values.size()) + " elements of " +
                                std::to_string(ring_bits) + " bits is " + std::to_string(values.size() * width) +
                                " bytes, not " + std::to_string(packed.size()));
  }
  const uint32_t mask = RingMask(ring_bits);
  ForEachRange(values.size(), size_t{1} << 18, [&](size_t begin, size_t count) {
    const char* in = packed.data() + begin * width;
    uint32_t* out = values.data() + begin;
    if (width == 2) {
      for (size_t i = 0; i < count; ++i) {
        uint16_t word;
        std::memcpy(&word, in + 2 * i, 2);
        out[i] = (out[i] + word) & mask;
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        uint32_t word;
        std::memcpy(&word, in + 4 * i, 4);
        out[i] += word;
      }
    }
  });
  return Status::Ok();
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
