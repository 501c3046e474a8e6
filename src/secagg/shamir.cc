#include "secagg/shamir.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "base/secure_random.h"

namespace parsyn::secagg {
namespace {

uint64_t Reduce(unsigned __int128 x) {
  // 2^61 = 1 (mod p): fold the high bits onto the low ones, twice.
  uint64_t r = static_cast<uint64_t>(x & kShamirPrime) + static_cast<uint64_t>(x >> 61);
  r = (r & kShamirPrime) + (r >> 61);
  return r >= kShamirPrime ? r - kShamirPrime : r;
}

uint64_t Add(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) + b); }
uint64_t Sub(uint64_t a, uint64_t b) { return Add(a, kShamirPrime - b); }
uint64_t Mul(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) * b); }

uint64_t Inverse(uint64_t a) {  // Fermat: a^(p-2)
  uint64_t result = 1, base = a, e = kShamirPrime - 2;
  for (; e > 0; e >>= 1) {
    if (e & 1) result = Mul(result, base);
    base = Mul(base, base);
  }
  return result;
}

// Uniform field elements: 61 random bits, redrawn in the one case (all ones) that is not below the prime.
StatusOr<std::vector<uint64_t>> RandomElements(size_t count) {
  std::vector<uint64_t> out(count);
  for (uint64_t& v : out) {
    do {
      unsigned char bytes[8];
      PARSYN_RETURN_IF_ERROR(SecureRandomBytes(bytes));
      v = 0;
      for (int i = 7; i >= 0; --i) v = (v << 8) | bytes[i];
      v &= kShamirPrime;
    } while (v == kShamirPrime);
  }
  return out;
}

// The Lagrange weights that evaluate the polynomial through `xs` at `at`: P(at) = sum_j w_j * y_j.
std::vector<uint64_t> LagrangeWeights(std::span<const uint64_t> xs, uint64_t at) {
  std::vector<uint64_t> weights(xs.size());
  for (size_t j = 0; j < xs.size(); ++j) {
    uint64_t numerator = 1, denominator = 1;
    for (size_t m = 0; m < xs.size(); ++m) {
      if (m == j) continue;
      numerator = Mul(numerator, Sub(at, xs[m]));
      denominator = Mul(denominator, Sub(xs[j], xs[m]));
    }
    weights[j] = Mul(numerator, Inverse(denominator));
  }
  return weights;
}

uint64_t Evaluate(std::span<const uint64_t> weights, std::span<const ShamirShare> shares, size_t chunk) {
  uint64_t sum = 0;
  for (size_t j = 0; j < weights.size(); ++j) sum = Add(sum, Mul(weights[j], shares[j].y[chunk]));
  return sum;
}

Status CheckSecretBytes(size_t secret_bytes) {
  if (secret_bytes == 0 || secret_bytes > kMaxSecretBytes) {
    return InvalidArgumentError("a shared secret is 1 to " + std::to_string(kMaxSecretBytes) + " bytes, not " +
                                std::to_string(secret_bytes));
  }
  return Status::Ok();
}

}  // namespace

size_t ShamirChunks(size_t secret_bytes) { return (secret_bytes + kShamirChunkBytes - 1) / kShamirChunkBytes; }

StatusOr<std::vector<ShamirShare>> SplitSecret(std::span<const unsigned char> secret, size_t threshold,
                                               std::span<const uint32_t> points) {
  PARSYN_RETURN_IF_ERROR(CheckSecretBytes(secret.size()));
  if (threshold < 1 || threshold > points.size()) {
    return InvalidArgumentError("a threshold of " + std::to_string(threshold) + " needs 1 to " +
                                std::to_string(points.size()) + " shares");
  }
  std::unordered_set<uint32_t> seen;
  for (uint32_t x : points) {
    if (x == 0 || !seen.insert(x).second) {
      return InvalidArgumentError("share points must be distinct and nonzero (point " + std::to_string(x) + ")");
    }
  }
  const size_t chunks = ShamirChunks(secret.size());
  std::vector<ShamirShare> shares(points.size());
  for (size_t i = 0; i < points.size(); ++i) shares[i] = {points[i], std::vector<uint64_t>(chunks)};
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t constant = 0;
    const size_t begin = c * kShamirChunkBytes, end = std::min(secret.size(), begin + kShamirChunkBytes);
    for (size_t b = end; b > begin; --b) constant = (constant << 8) | secret[b - 1];
    PARSYN_ASSIGN_OR_RETURN(std::vector<uint64_t> coefficients, RandomElements(threshold - 1));
    for (ShamirShare& share : shares) {
      uint64_t value = 0;  // Horner, highest coefficient first
      for (size_t k = coefficients.size(); k > 0; --k) value = Add(Mul(value, share.x), coefficients[k - 1]);
      share.y[c] = Add(Mul(value, share.x), constant);
    }
  }
  return shares;
}

StatusOr<std::vector<unsigned char>> CombineShares(std::span<const ShamirShare> shares, size_t threshold,
                                                   size_t secret_bytes) {
  PARSYN_RETURN_IF_ERROR(CheckSecretBytes(secret_bytes));
  if (threshold < 1 || shares.size() < threshold) {
    return FailedPreconditionError("the secret needs " + std::to_string(threshold) + " shares and " +
                                   std::to_string(shares.size()) + " are at hand");
  }
  const size_t chunks = ShamirChunks(secret_bytes);
  std::unordered_set<uint32_t> seen;
  for (const ShamirShare& share : shares) {
    if (share.x == 0 || !seen.insert(share.x).second || share.y.size() != chunks) {
      return InvalidArgumentError("shares must have distinct nonzero points and " + std::to_string(chunks) +
                                  " elements each (point " + std::to_string(share.x) + ")");
    }
    for (uint64_t y : share.y) {
      if (y >= kShamirPrime) return InvalidArgumentError("a share element is not below the field's prime");
    }
  }
  const std::span<const ShamirShare> defining = shares.first(threshold);
  std::vector<uint64_t> xs(threshold);
  for (size_t j = 0; j < threshold; ++j) xs[j] = defining[j].x;
  const std::vector<uint64_t> at_zero = LagrangeWeights(xs, 0);
  for (const ShamirShare& extra : shares.subspan(threshold)) {
    const std::vector<uint64_t> at_extra = LagrangeWeights(xs, extra.x);
    for (size_t c = 0; c < chunks; ++c) {
      if (Evaluate(at_extra, defining, c) != extra.y[c]) {
        return DataLossError("the share at point " + std::to_string(extra.x) +
                             " does not lie on the polynomial of the others: a share is corrupt");
      }
    }
  }
  std::vector<unsigned char> secret(secret_bytes);
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t value = Evaluate(at_zero, defining, c);
    const size_t begin = c * kShamirChunkBytes, end = std::min(secret_bytes, begin + kShamirChunkBytes);
    for (size_t b = begin; b < end; ++b, value >>= 8) secret[b] = static_cast<unsigned char>(value & 0xff);
    if (value != 0) return DataLossError("the shares do not give back a secret: one is corrupt, or they differ");
  }
  return secret;
}

}  // namespace parsyn::secagg
