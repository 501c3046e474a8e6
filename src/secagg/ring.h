// Secure aggregation's arithmetic: vectors of integers modulo 2^m, m = 16 or 32 bits, held as uint32_t words (each
// below 2^m), and the masks that hide them, expanded from 32-byte seeds by AES-256-CTR (2.2x ChaCha20's speed here
// with AES-NI: masks are the coordinator's main cost). On the wire a vector takes m / 8 bytes per element,
// little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "secagg/crypto.h"

namespace parsyn::secagg {

// The smallest of 16 and 32 bits that holds the sum of `contributors` values of `quantization_bits` bits each (every
// value at most 2^bits - 1). InvalidArgument if 32 bits do not (or the bits are not 8 or 16).
StatusOr<int> RingBits(int quantization_bits, size_t contributors);

inline uint32_t RingMask(int ring_bits) { return ring_bits >= 32 ? ~uint32_t{0} : (uint32_t{1} << ring_bits) - 1; }

// values[i] += sign * mask[first_element + i] (mod 2^ring_bits), sign +1 or -1, where mask is the stream of m-bit
// words expanded from `seed`: any piece of a vector is masked without the rest (chunked unmasking).
void ApplyMask(const Key32& seed, int sign, int ring_bits, uint64_t first_element, std::span<uint32_t> values);

struct SignedSeed {
  Key32 seed{};
  int sign = 1;  // +1 adds the seed's mask, -1 subtracts it
};

// ApplyMask for each of `masks`, over the whole of `values` (first element 0), split into ranges across threads.
void ApplyMasks(std::span<const SignedSeed> masks, int ring_bits, std::span<uint32_t> values);

// values[i] += the i-th element of `packed` (PackRing's form) mod 2^ring_bits, without unpacking it first, across
// threads: how the coordinator adds a masked input as it arrives. InvalidArgument (nothing added) if `packed` is not
// values.size() elements of the width.
Status AddPacked(std::span<uint32_t> values, std::string_view packed, int ring_bits);

// values[i] = (values[i] + other[i]) mod 2^ring_bits. The spans have one length.
void AddInto(std::span<uint32_t> values, std::span<const uint32_t> other, int ring_bits);

// m / 8 bytes per element, little-endian; and back (InvalidArgument for a length that is not a whole number of
// elements, or not `elements` of them).
std::string PackRing(std::span<const uint32_t> values, int ring_bits);
StatusOr<std::vector<uint32_t>> UnpackRing(std::string_view bytes, int ring_bits, size_t elements);

}  // namespace parsyn::secagg
