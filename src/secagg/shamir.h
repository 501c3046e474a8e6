// Shamir secret sharing over the prime field GF(2^61 - 1), for the 32-byte secrets of secure aggregation (a worker's
// masking key and its self-mask seed). A secret is cut into 7-byte chunks, each the constant term of its own random
// polynomial of degree threshold - 1; a share is the polynomials' values at the holder's point. Any `threshold`
// shares give the secret back; fewer are independent of it (every secret of the length is equally likely).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace parsyn::secagg {

inline constexpr uint64_t kShamirPrime = (uint64_t{1} << 61) - 1;
inline constexpr size_t kShamirChunkBytes = 7;  // 56 bits, below the prime
inline constexpr size_t kMaxSecretBytes = 64;

struct ShamirShare {
  uint32_t x = 0;           // the holder's point, nonzero
  std::vector<uint64_t> y;  // one field element per chunk of the secret
  bool operator==(const ShamirShare&) const = default;
};

// The number of field elements in a share of a `secret_bytes` secret.
size_t ShamirChunks(size_t secret_bytes);

// One share of `secret` (1..64 bytes) per point of `points` (distinct, nonzero), with coefficients from getrandom.
// InvalidArgument for a threshold outside 1..points.size(), a repeated or zero point, or a secret of a bad length.
StatusOr<std::vector<ShamirShare>> SplitSecret(std::span<const unsigned char> secret, size_t threshold,
                                               std::span<const uint32_t> points);

// The secret of `secret_bytes` bytes from `shares` (distinct points). FailedPrecondition with fewer than `threshold`
// shares. The first `threshold` define the polynomials; each further share must lie on them, and every chunk must be
// a chunk a secret could have: DataLoss otherwise (a corrupt share, or shares of different secrets). A corrupt share
// among exactly `threshold` is not detected here; callers check the secret against a commitment.
StatusOr<std::vector<unsigned char>> CombineShares(std::span<const ShamirShare> shares, size_t threshold,
                                                   size_t secret_bytes);

}  // namespace parsyn::secagg
