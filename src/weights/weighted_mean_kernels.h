// The streaming weighted mean's kernels (weighted_mean.cc): plain loops that GCC and Clang vectorise, the AVX-512
// paths of exact accumulation, the magnitude scan, the conversions and the parallel loop. Included only by
// weighted_mean.cc, which is compiled with -ffp-contract=off (src/weights/CMakeLists.txt): the bits of kExact depend
// on it.
#pragma once

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "weights/weighted_mean.h"

namespace parsyn::weights::mean_kernels {

// Work is split into chunks of this many elements (256 KiB of fp32): small enough to balance across threads, large
// enough that the per-chunk overhead vanishes next to the streaming loop.
inline constexpr size_t kChunkElements = size_t{1} << 16;
// Below this many elements in total, threads cost more than they save.
inline constexpr size_t kMinElementsForThreads = size_t{1} << 18;

// kExact's fixed-point grid: a value x is stored as round(x * 2^64) in an int128. Terms are limited to |x| < 2^52
// (so a term is below 2^116) and the sum of all accepted terms' magnitude bounds to < 2^62 (2^126 on the grid), so
// the integer sum can never overflow whatever the order.
inline constexpr double kExactMaxTerm = 0x1p52;
inline constexpr double kExactMaxSum = 0x1p62;

// Largest finite magnitude each accumulator can reach before it overflows to Inf.
inline double MaxAccumulatorMagnitude(Accumulation mode) {
  switch (mode) {
    case Accumulation::kFloat32: return std::numeric_limits<float>::max();
    case Accumulation::kFloat64: return std::numeric_limits<double>::max();
    case Accumulation::kExact: return kExactMaxSum;
  }
  return 0;
}

inline bool IsAveragedDtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// Kernels. Plain contiguous loops with no branches per element, so GCC/Clang vectorise them at -O3.

inline float Bf16Bits(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

// F16 -> float with selects instead of branches (same result as F16ToFloat), so the loop vectorises.
inline float F16Bits(uint16_t h) {
  const uint32_t magnitude = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exponent = magnitude & (0x7c00u << 13);
  const uint32_t normal = magnitude + ((127u - 15u) << 23);
  const uint32_t inf_nan = normal + ((128u - 16u) << 23);
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(normal + (1u << 23)) - std::bit_cast<float>(113u << 23));
  // Selects written as masks: GCC keeps `?:` here as branches, which stops vectorisation.
  const uint32_t is_inf_nan = 0u - static_cast<uint32_t>(exponent == (0x7c00u << 13));
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(exponent == 0);
  uint32_t bits = (inf_nan & is_inf_nan) | (normal & ~is_inf_nan);
  bits = (subnormal & is_subnormal) | (bits & ~is_subnormal);
  return std::bit_cast<float>(bits | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// acc[i] += scale * w[i], or acc[i] = scale * w[i] for the first update (kFirst), which spares reading the
// accumulator once. Acc is float or double; `load` widens one stored element to float.
template <bool kFirst, typename Acc, typename In, typename Load>
void Accumulate(Acc* __restrict acc, const In* __restrict w, size_t count, Acc scale, Load load) {
  for (size_t i = 0; i < count; ++i) {
    const Acc term = scale * static_cast<Acc>(load(w[i]));
    if constexpr (kFirst) {
      acc[i] = term;
    } else {
      acc[i] += term;
    }
  }
}

// round(x * 2^64), to nearest even, for |x| < 2^52 (checked by the caller); a function of x only, never of order.
// x is split into three exact parts, each taken with one hardware double -> int64 conversion (a direct conversion of
// x * 2^64 to int128 is a library call, and it is what most terms need: n * w exceeds 0.5 whenever n is a sample
// count):
//   x * 2^64 = whole * 2^64 + high * 2^32 + low_bits, with whole and high truncated toward zero and |low_bits| < 2^32.
// Each subtraction of a truncated part is exact, and whole * 2^64 + high * 2^32 is an even integer, so rounding
// low_bits to nearest even rounds the whole value to nearest even.
inline __int128 ToFixed(double x) {
  const int64_t whole = static_cast<int64_t>(x);
  const double high_bits = (x - static_cast<double>(whole)) * 0x1p32;
  const int64_t high = static_cast<int64_t>(high_bits);
  const double low_bits = (high_bits - static_cast<double>(high)) * 0x1p32;
  // Adding and subtracting 1.5 * 2^52 rounds to an integer (nearest even) for |low_bits| < 2^51.
  constexpr double kRoundMagic = 0x1.8p52;
  const int64_t low = static_cast<int64_t>((low_bits + kRoundMagic) - kRoundMagic);
  // Shifts of negative values are defined since C++20 (two's complement).
  return (static_cast<__int128>(whole) << 64) + (static_cast<__int128>(high) << 32) + low;
}

// v rounded once to long double (nearest even), as static_cast<long double>(v) would, without its library call:
// both halves convert exactly (64-bit significand) and their sum is rounded once.
inline long double ToLongDouble(__int128 v) {
  const auto high = static_cast<int64_t>(v >> 64);
  const auto low = static_cast<uint64_t>(v);
  return static_cast<long double>(high) * 0x1p64L + static_cast<long double>(low);
}

template <bool kFirst, typename In, typename Load>
void AccumulateExact(__int128* __restrict acc, const In* __restrict w, size_t count, double n, Load load) {
  for (size_t i = 0; i < count; ++i) {
    const __int128 term = ToFixed(n * static_cast<double>(load(w[i])));
    if constexpr (kFirst) {
      acc[i] = term;
    } else {
      acc[i] += term;
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// AccumulateExact for F32 updates, 8 elements at a time with AVX-512 (F, DQ: packed double <-> int64 conversions):
// the same operations as ToFixed and the int128 add, lane by lane, so the same bits. The int128 sums are pairs of
// 64-bit words (low, high) in memory; they are split into a vector of lows and one of highs and put back after.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own intrinsics headers (`__Y = __Y`)
inline constexpr size_t kAccumulatePrefetchBytes = 4096;
template <bool kFirst>
__attribute__((target("avx512f,avx512dq"))) size_t AccumulateExactF32Avx512(__int128* __restrict acc,
                                                                            const float* __restrict w, size_t count,
                                                                            double n) {
  const __m512d scale = _mm512_set1_pd(n);
  const __m512d two32 = _mm512_set1_pd(0x1p32);
  const __m512d round_magic = _mm512_set1_pd(0x1.8p52);
  const __m512i one = _mm512_set1_epi64(1);
  // Word indices of the lows (even) and highs (odd) across two vectors of 4 int128 each, and back.
  const __m512i lows = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i highs = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i first_half = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i second_half = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // The update is read once, from memory (page cache written by its upload): the hardware prefetcher stops at each
    // 4 KiB page, where this loop then waits on DRAM. A software prefetch 4 KiB ahead keeps the stream going (a batch
    // of 64 x 2 MiB updates: ~80 ms without).
    _mm_prefetch(reinterpret_cast<const char*>(w + i) + kAccumulatePrefetchBytes, _MM_HINT_T0);
    const __m512d x = _mm512_mul_pd(scale, _mm512_cvtps_pd(_mm256_loadu_ps(w + i)));
    const __m512i whole = _mm512_cvttpd_epi64(x);
    const __m512d high_bits = _mm512_mul_pd(_mm512_sub_pd(x, _mm512_cvtepi64_pd(whole)), two32);
    const __m512i high = _mm512_cvttpd_epi64(high_bits);
    const __m512d low_bits = _mm512_mul_pd(_mm512_sub_pd(high_bits, _mm512_cvtepi64_pd(high)), two32);
    const __m512i low = _mm512_cvttpd_epi64(_mm512_sub_pd(_mm512_add_pd(low_bits, round_magic), round_magic));
    // term = whole * 2^64 + high * 2^32 + low, as (low word, high word) with the carry of the low words.
    const __m512i shifted = _mm512_slli_epi64(high, 32);
    __m512i term_low = _mm512_add_epi64(shifted, low);
    __m512i term_high =
        _mm512_add_epi64(whole, _mm512_add_epi64(_mm512_srai_epi64(high, 32), _mm512_srai_epi64(low, 63)));
    term_high = _mm512_mask_add_epi64(term_high, _mm512_cmplt_epu64_mask(term_low, shifted), term_high, one);
    __m512i* out = reinterpret_cast<__m512i*>(acc + i);
    if constexpr (!kFirst) {
      const __m512i a = _mm512_loadu_si512(out);
      const __m512i b = _mm512_loadu_si512(out + 1);
      const __m512i acc_low = _mm512_permutex2var_epi64(a, lows, b);
      const __m512i acc_high = _mm512_permutex2var_epi64(a, highs, b);
      term_low = _mm512_add_epi64(acc_low, term_low);
      term_high = _mm512_add_epi64(acc_high, term_high);
      term_high = _mm512_mask_add_epi64(term_high, _mm512_cmplt_epu64_mask(term_low, acc_low), term_high, one);
    }
    _mm512_storeu_si512(out, _mm512_permutex2var_epi64(term_low, first_half, term_high));
    _mm512_storeu_si512(out + 1, _mm512_permutex2var_epi64(term_low, second_half, term_high));
  }
  return i;
}

// The kExact means of sums[0, count) into out, for count rounded down to a multiple of 8; returns that count.
// out[i] = float(ToLongDouble(sums[i]) / exact_total), the same bits as the 80-bit divide, mostly without it:
// q = double(|sum|) * (1 / double(total)) is within 6 double rounding errors (< 2^-50 relative) of the exact
// quotient, and the long double quotient within 2^-62 of it. Unless q lies within 2^-43 (relative) of the midpoint
// between two floats, all three round to the same float, so q's rounding is the answer; lanes near a midpoint
// (~4 in a million for arbitrary values), zero sums and results outside the normal float range take the 80-bit
// divide. q's low 29 mantissa bits are what float rounding drops: the midpoint is 2^28 there, and 1024 of those
// units are at least 2^-43 of q.
inline __attribute__((target("avx512f,avx512dq"))) size_t ExactMeansAvx512(const __int128* __restrict sums,
                                                                           float* __restrict out, size_t count,
                                                                           long double exact_total) {
  const __m512d inverse_total = _mm512_set1_pd(1.0 / static_cast<double>(exact_total));
  const __m512d two64 = _mm512_set1_pd(0x1p64);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i lows = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i highs = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i dropped_mask = _mm512_set1_epi64((int64_t{1} << 29) - 1);
  const __m512i near_midpoint_low = _mm512_set1_epi64((int64_t{1} << 28) - 1024);
  const __m512i near_midpoint_span = _mm512_set1_epi64(2048);
  const __m512i exponent_min = _mm512_set1_epi64(1023 - 126);  // 2^-126: the smallest normal float
  const __m512i exponent_span = _mm512_set1_epi64(126 + 127);  // below 2^128
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m512i a = _mm512_loadu_si512(sums + i);
    const __m512i b = _mm512_loadu_si512(sums + i + 4);
    __m512i low = _mm512_permutex2var_epi64(a, lows, b);
    __m512i high = _mm512_permutex2var_epi64(a, highs, b);
    // |sum| as (high, low): negate where negative (two's complement over 128 bits).
    const __mmask8 negative = _mm512_cmplt_epi64_mask(high, zero);
    const __mmask8 borrow = _mm512_mask_cmpneq_epi64_mask(negative, low, zero);
    high = _mm512_mask_sub_epi64(high, negative, zero, high);
    high = _mm512_mask_sub_epi64(high, borrow, high, one);
    low = _mm512_mask_sub_epi64(low, negative, zero, low);
    const __mmask8 nonzero = _mm512_test_epi64_mask(_mm512_or_si512(high, low), _mm512_or_si512(high, low));
    const __m512d magnitude = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi64_pd(high), two64), _mm512_cvtepu64_pd(low));
    const __m512d q = _mm512_mul_pd(magnitude, inverse_total);
    const __m512i bits = _mm512_castpd_si512(q);
    const __m512i exponent = _mm512_sub_epi64(_mm512_srli_epi64(bits, 52), exponent_min);
    const __m512i dropped = _mm512_sub_epi64(_mm512_and_si512(bits, dropped_mask), near_midpoint_low);
    const __mmask8 in_range = _mm512_cmple_epu64_mask(exponent, exponent_span);
    const __mmask8 clear_of_midpoint = _mm512_cmpgt_epu64_mask(dropped, near_midpoint_span);
    const __mmask8 slow = nonzero & ~(in_range & clear_of_midpoint);
    // Rounding is symmetric, so the sign goes back on before it; to nearest even (the default mode). A zero sum is +0.
    const __m512d signed_q = _mm512_mask_sub_pd(q, negative, _mm512_setzero_pd(), q);
    _mm256_storeu_ps(out + i, _mm512_cvtpd_ps(signed_q));
    for (unsigned m = slow; m != 0; m &= m - 1) {
      const size_t at = i + static_cast<size_t>(std::countr_zero(m));
      out[at] = static_cast<float>(ToLongDouble(sums[at]) / exact_total);
    }
  }
  return i;
}
#pragma GCC diagnostic pop

inline bool HasAvx512Dq() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
}
#endif

inline float LoadF32(float v) { return v; }
inline float LoadBf16(uint16_t v) { return Bf16Bits(v); }
inline float LoadF16(uint16_t v) { return F16Bits(v); }

// Largest magnitude in w as its bit pattern with the sign cleared: for IEEE formats that order is the order of
// magnitudes, and any value at or above the exponent-all-ones pattern is Inf or NaN. One integer max-reduction, so
// the finiteness scan and the range check share one vectorised pass. Bits is signed (the masked values are
// non-negative) because SSE2 has signed but not unsigned max/compare.
// The range is read as four interleaved streams: where memory is latency-bound per stream (as on the shared
// 2-core VM this was tuned on), one sequential read stream reached 1.5 GB/s and four reached 3 GB/s.
template <typename Bits, Bits kMagnitudeMask>
Bits MaxMagnitudeBits(const Bits* __restrict w, size_t count) {
  const size_t part = count / 4;
  const Bits* __restrict w1 = w + part;
  const Bits* __restrict w2 = w + 2 * part;
  const Bits* __restrict w3 = w + 3 * part;
  Bits m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  for (size_t i = 0; i < part; ++i) {
    m0 = std::max<Bits>(m0, w[i] & kMagnitudeMask);
    m1 = std::max<Bits>(m1, w1[i] & kMagnitudeMask);
    m2 = std::max<Bits>(m2, w2[i] & kMagnitudeMask);
    m3 = std::max<Bits>(m3, w3[i] & kMagnitudeMask);
  }
  Bits max_bits = std::max(std::max(m0, m1), std::max(m2, m3));
  for (size_t i = 4 * part; i < count; ++i) max_bits = std::max<Bits>(max_bits, w[i] & kMagnitudeMask);
  return max_bits;
}

// dst[i] = float(src[i] * scale), with src read as two interleaved streams (see MaxMagnitudeBits for why).
template <typename Acc>
void ScaleToFloat(const Acc* __restrict src, float* __restrict dst, size_t count, double scale) {
  const size_t half = count / 2;
  for (size_t i = 0; i < half; ++i) {
    dst[i] = static_cast<float>(src[i] * scale);
    dst[half + i] = static_cast<float>(src[half + i] * scale);
  }
  if (count % 2) dst[count - 1] = static_cast<float>(src[count - 1] * scale);
}

// sums[i] = float(sums[i] * scale) in place, as two interleaved streams.
inline void ScaleInPlace(float* sums, size_t count, double scale) {
  const size_t half = count / 2;
  float* __restrict low = sums;
  float* __restrict high = sums + half;
  for (size_t i = 0; i < half; ++i) {
    low[i] = static_cast<float>(low[i] * scale);
    high[i] = static_cast<float>(high[i] * scale);
  }
  if (count % 2) sums[count - 1] = static_cast<float>(sums[count - 1] * scale);
}

// Runs fn(item) for item in [0, num_items) on up to num_threads threads (the caller is one of them).
template <typename Fn>
void ParallelFor(size_t num_items, int num_threads, size_t total_elements, Fn&& fn) {
  const size_t threads =
      total_elements < kMinElementsForThreads ? 1 : std::min<size_t>(static_cast<size_t>(num_threads), num_items);
  if (threads <= 1) {
    for (size_t i = 0; i < num_items; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < num_items;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
    }
  };
  std::vector<std::jthread> helpers;
  helpers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(worker);
  worker();
}  // helpers join here

// Round-to-nearest-even float -> bf16 for finite values (the mean of finite values is finite), without the NaN
// branch of FloatToBf16 so the finishing loop vectorises.
inline uint16_t FiniteFloatToBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace parsyn::weights::mean_kernels
