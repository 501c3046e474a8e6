#include "weights/update_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "base/strings.h"

// Built with -ffp-contract=off (CMakeLists.txt): the encoder's residual and the decoder must compute
// zero + q * scale with the same two roundings, which a fused multiply-add in one of them would break.

namespace parsyn::weights {
namespace {

constexpr std::string_view kCodecKey = "codec";
constexpr std::string_view kVersionKey = "codec_version";
constexpr std::string_view kDeltaKey = "delta";
constexpr std::string_view kSchemeKey = "scheme";
constexpr std::string_view kVersion = "1";
constexpr std::string_view kScaleSuffix = ".__scale";
constexpr std::string_view kZeroSuffix = ".__zero";
constexpr std::string_view kValuesSuffix = ".__q";
// Values per inner step: the encoder's and decoder's scratch (stack) buffers and the decoder's read size.
constexpr int64_t kChunk = 4096;

struct Format {
  UpdateCodec codec = UpdateCodec::kBf16;
  QuantScheme scheme = QuantScheme::kSymmetric;
  bool delta = false;
  bool quantised() const { return codec == UpdateCodec::kInt8 || codec == UpdateCodec::kInt4; }
  bool affine() const { return scheme == QuantScheme::kAffine; }
  // Largest stored level: symmetric levels are -qmax..qmax, affine 0..qmax.
  int qmax() const {
    if (codec == UpdateCodec::kInt8) return affine() ? 255 : 127;
    return affine() ? 15 : 7;
  }
};

struct Part {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t bytes;
};

// How one tensor of the global's layout travels: as BF16 (bf16 codec), as F32 values (int codecs: tensors of rank
// <= 1 and empty ones), or quantised in `groups` groups of `group_len` consecutive values, each with its own scale.
struct TensorPlan {
  enum Form { kBf16, kRawF32, kQuantised };
  const Tensor* tensor;
  int64_t numel;
  Form form;
  int64_t group_len = 0;
  int64_t groups = 0;
  std::vector<Part> parts;  // in data order: scale, zero (affine), values
};

StatusOr<std::vector<TensorPlan>> Plan(const WeightSet& layout, const Format& format) {
  std::vector<TensorPlan> plans;
  plans.reserve(layout.size());
  std::set<std::string_view> names;
  for (const Tensor& t : layout.tensors()) {
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
      return InvalidArgumentError("tensor " + SingleQuoted(t.name) + " has dtype " + std::string(DTypeName(t.dtype)) +
                                  "; only F32, BF16 and F16 tensors can be compressed");
    }
    TensorPlan plan{.tensor = &t, .numel = t.numel(), .form = TensorPlan::kBf16, .parts = {}};
    const uint64_t numel = static_cast<uint64_t>(plan.numel);
    if (format.codec == UpdateCodec::kBf16) {
      plan.parts.push_back({t.name, DType::kBF16, t.shape, numel * 2});
    } else if (t.shape.size() <= 1 || plan.numel == 0) {
      plan.form = TensorPlan::kRawF32;
      plan.parts.push_back({t.name, DType::kF32, t.shape, numel * 4});
    } else {
      plan.form = TensorPlan::kQuantised;
      const int64_t rows = t.shape[0];
      const int64_t cols = plan.numel / rows;
      const int64_t rows_per_group = cols >= kMinValuesPerScale ? 1 : (kMinValuesPerScale + cols - 1) / cols;
      plan.group_len = rows_per_group * cols;
      plan.groups = (rows + rows_per_group - 1) / rows_per_group;
      const uint64_t groups = static_cast<uint64_t>(plan.groups);
      plan.parts.push_back({t.name + std::string(kScaleSuffix), DType::kF32, {plan.groups}, groups * 4});
      if (format.affine()) {
        plan.parts.push_back({t.name + std::string(kZeroSuffix), DType::kF32, {plan.groups}, groups * 4});
      }
      if (format.codec == UpdateCodec::kInt8) {
        plan.parts.push_back(
            {t.name + std::string(kValuesSuffix), format.affine() ? DType::kU8 : DType::kI8, t.shape, numel});
      } else {
        const int64_t packed = (plan.numel + 1) / 2;
        plan.parts.push_back({t.name + std::string(kValuesSuffix), DType::kU8, {packed}, uint64_t(packed)});
      }
    }
    for (const Part& part : plan.parts) {
      if (!names.insert(part.name).second) {
        return InvalidArgumentError("tensor " + SingleQuoted(t.name) + ": its compressed part " +
                                    SingleQuoted(part.name) + " collides with another tensor's name");
      }
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

// The encoder's and decoder's per-tensor loops get an AVX2 copy besides the baseline x86-64 (SSE2) one, picked once
// at load time (GCC's target_clones, an ifunc): SSE2 lacks the 32-bit integer min/max and the wide conversions the
// loops need, so its copy runs them in several instructions each (perf: the range pass). Every operation in them is
// exact IEEE arithmetic without contraction (-ffp-contract=off, and the avx2 target has no FMA), so both copies
// produce the same bits: an encoder and a decoder on different machines agree.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define PARSYN_HOT_LOOPS [[gnu::target_clones("avx2", "default")]]
#else
#define PARSYN_HOT_LOOPS
#endif

// ---- Arithmetic shared by encoder and decoder ----

// Round to nearest even for |v| <= 2^22 (levels are at most 255): adding and removing 1.5 * 2^23 leaves the integer
// part, and unlike nearbyint it vectorises on baseline x86-64.
inline float RoundLevel(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// By value and as selects, so the loops using it vectorise (std::clamp's references defeat that).
inline float Clamp(float v, float lo, float hi) {
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

inline float Dequantise(float level, float scale, float zero) { return zero + level * scale; }

// A scale for values spanning `range` (max |x| when symmetric, max - min when affine) over `levels` steps: every
// value lands within scale/2 of a level (range / scale <= levels + 1/2), and `base + levels * scale` stays finite.
float ChooseScale(float range, int levels, float base) {
  if (range == 0) return 0;
  float scale = std::max(range / static_cast<float>(levels), std::numeric_limits<float>::denorm_min());
  while (!std::isfinite(Dequantise(static_cast<float>(levels), scale, base)) && scale > 0) {
    scale = std::nextafter(scale, 0.0f);
  }
  while (range / scale > static_cast<float>(levels) + 0.5f) scale = std::nextafter(scale, INFINITY);
  return scale;
}

float LoadFloat(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kBF16: return Bf16ToFloat(t.as<uint16_t>()[i]);
    default: return F16ToFloat(t.as<uint16_t>()[i]);
  }
}

// Copies values [begin, begin + n) of `t` as float into `out`.
void LoadFloats(const Tensor& t, int64_t begin, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::kF32: std::memcpy(out, t.as<float>().data() + begin, n * sizeof(float)); break;
    case DType::kBF16: {
      const uint16_t* in = t.as<uint16_t>().data() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
      break;
    }
    default: {
      const uint16_t* in = t.as<uint16_t>().data() + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToFloat(in[i]);
    }
  }
}

inline bool NonFinite(float v) { return (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u; }
// The hot loops OR these together and test bit 31 once: the exponent field plus one carries into bit 31 only when it
// is all ones (Inf/NaN). Integer and/add/or, so the loops vectorise (a bool OR-reduction does not).
inline uint32_t NonFiniteBit(float v) { return (std::bit_cast<uint32_t>(v) & 0x7f800000u) + 0x00800000u; }
inline uint32_t NonFiniteBitBf16(uint16_t v) { return ((v & 0x7f80u) + 0x0080u) << 16; }
// FloatToBf16 for values known not to be NaN (round to nearest even), without its NaN branch.
inline uint16_t Bf16FromNonNan(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---- Encoder ----

static_assert(std::endian::native == std::endian::little, "nibble packing reads level pairs as little-endian u16");

// out[j] = levels[2j] | levels[2j + 1] << 4 for levels < 16, as one u16 load per pair (w | w >> 4 moves the high
// byte's nibble next to the low one): contiguous loads and stores, so it vectorises, unlike a stride-2 byte loop.
inline void PackNibbles(const uint8_t* levels, int64_t pairs, uint8_t* out) {
  for (int64_t j = 0; j < pairs; ++j) {
    uint16_t w;
    std::memcpy(&w, levels + 2 * j, 2);
    out[j] = static_cast<uint8_t>(w | (w >> 4));
  }
}

// Affine levels of x[0, n): round((x - zero) * inverse) clamped to 0..top, or dividing by the scale when its inverse
// overflows. Out of line, one loop per case: inlined into the encoder GCC left both loops scalar.
PARSYN_HOT_LOOPS [[gnu::noinline]] void QuantiseAffine(const float* x, int64_t n, float zero, float inverse_or_scale,
                                                       bool divide, float top, uint8_t* levels) {
  if (divide) {
    for (int64_t i = 0; i < n; ++i) {
      levels[i] =
          static_cast<uint8_t>(static_cast<int32_t>(RoundLevel(Clamp((x[i] - zero) / inverse_or_scale, 0.0f, top))));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    levels[i] =
        static_cast<uint8_t>(static_cast<int32_t>(RoundLevel(Clamp((x[i] - zero) * inverse_or_scale, 0.0f, top))));
  }
}

// Symmetric levels of x[0, n) in one pass: round(x / scale) clamped to -qmax..qmax, stored offset by `offset` (int8:
// 0, two's complement; int4: 8, nibbles 1..15), and the residual x - level * scale when `residual` is given. The
// variants are template parameters so each loop is branch-free; inlined into the (cloned) encoder.
template <bool kDivide, bool kResidual>
inline void QuantiseSymmetric(const float* x, int64_t n, float scale, float inverse, float qmax, int32_t offset,
                              uint8_t* levels, float* residual) {
  for (int64_t i = 0; i < n; ++i) {
    const float level = RoundLevel(Clamp(kDivide ? x[i] / scale : x[i] * inverse, -qmax, qmax));
    if constexpr (kResidual) residual[i] = x[i] - Dequantise(level, scale, 0.0f);
    levels[i] = static_cast<uint8_t>(static_cast<int32_t>(level) + offset);
  }
}

// A signed integer whose order is the float's (for non-NaN values), and back: negative floats have their magnitude
// bits flipped. Self-inverse.
inline int32_t OrderKey(float v) {
  const int32_t bits = std::bit_cast<int32_t>(v);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}
inline float FromOrderKey(int32_t key) { return std::bit_cast<float>(key ^ ((key >> 31) & 0x7fffffff)); }

// The values to encode for one tensor: update [- global] [+ carried residual], in chunks.
class ValueSource {
 public:
  ValueSource(const Tensor& update, const Tensor* global, const Tensor* carried)
      : update_(update), global_(global), carried_(carried) {}

  // Values [begin, begin + n), n <= kChunk: a pointer into the update itself when nothing is to be computed.
  // (update - global) + carried in one pass, reading F32 inputs where they lie (no copy into scratch first).
  const float* Get(int64_t begin, int64_t n, float* scratch) const {
    const bool f32 = update_.dtype == DType::kF32;
    if (f32 && !global_ && !carried_) return update_.as<float>().data() + begin;
    const float* u = scratch;
    if (f32) {
      u = update_.as<float>().data() + begin;
    } else {
      LoadFloats(update_, begin, n, scratch);
    }
    if (!global_ && !carried_) return scratch;
    float global_values[kChunk];
    const float* g = nullptr;
    if (global_ && global_->dtype == DType::kF32) {
      g = global_->as<float>().data() + begin;
    } else if (global_) {
      LoadFloats(*global_, begin, n, global_values);
      g = global_values;
    }
    const float* r = carried_ ? carried_->as<float>().data() + begin : nullptr;
    if (g && r) {
      for (int64_t i = 0; i < n; ++i) scratch[i] = (u[i] - g[i]) + r[i];
    } else if (g) {
      for (int64_t i = 0; i < n; ++i) scratch[i] = u[i] - g[i];
    } else {
      for (int64_t i = 0; i < n; ++i) scratch[i] = u[i] + r[i];
    }
    return scratch;
  }

  // InvalidArgument naming the first non-finite value the encoder would see (a delta or a sum that overflowed).
  Status CheckFinite(int64_t begin, int64_t n, const float* x) const {
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= NonFiniteBit(x[i]);
    if ((bad >> 31) == 0) return Status::Ok();
    for (int64_t i = 0; i < n; ++i) {
      if (NonFinite(x[i])) {
        return InvalidArgumentError(
            "tensor " + SingleQuoted(update_.name) + ": the value to encode at index " + std::to_string(begin + i) +
            " is not finite" +
            (global_ || carried_ ? " (a non-finite input, or the delta or residual sum overflowed)" : ""));
      }
    }
    return Status::Ok();
  }

 private:
  const Tensor& update_;
  const Tensor* global_;
  const Tensor* carried_;
};

PARSYN_HOT_LOOPS Status EncodeFloats(const TensorPlan& plan, const ValueSource& source, std::span<std::byte> out,
                                     bool as_bf16, float* residual) {
  float scratch[kChunk];
  for (int64_t begin = 0; begin < plan.numel; begin += kChunk) {
    const int64_t n = std::min(kChunk, plan.numel - begin);
    const float* x = source.Get(begin, n, scratch);
    if (as_bf16) {
      uint16_t* q = reinterpret_cast<uint16_t*>(out.data()) + begin;
      uint32_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        q[i] = Bf16FromNonNan(x[i]);  // a NaN x is caught by the first term and refused below
        bad |= NonFiniteBit(x[i]) | NonFiniteBitBf16(q[i]);
      }
      const bool overflow = (bad >> 31) != 0;
      if (overflow) PARSYN_RETURN_IF_ERROR(source.CheckFinite(begin, n, x));
      for (int64_t i = 0; overflow && i < n; ++i) {
        if ((q[i] & 0x7f80) == 0x7f80) {
          return InvalidArgumentError("tensor " + SingleQuoted(plan.tensor->name) + ": the value at index " +
                                      std::to_string(begin + i) + " overflows bf16 (" + std::to_string(x[i]) + ")");
        }
      }
      if (residual) {
        for (int64_t i = 0; i < n; ++i) residual[begin + i] = x[i] - Bf16ToFloat(q[i]);
      }
    } else {
      PARSYN_RETURN_IF_ERROR(source.CheckFinite(begin, n, x));
      std::memcpy(out.data() + begin * 4, x, n * 4);
      if (residual) std::memset(residual + begin, 0, n * 4);  // sent exactly (after x was read: it may be carried)
    }
  }
  return Status::Ok();
}

PARSYN_HOT_LOOPS Status EncodeQuantised(const TensorPlan& plan, const Format& format, const ValueSource& source,
                                        float* scales, float* zeros, std::span<std::byte> values, float* residual) {
  const int qmax = format.qmax();
  const bool affine = format.affine();
  const bool int4 = format.codec == UpdateCodec::kInt4;
  float scratch[kChunk];
  uint8_t levels[kChunk];
  for (int64_t g = 0; g < plan.groups; ++g) {
    const int64_t group_begin = g * plan.group_len;
    const int64_t group_end = std::min(plan.numel, group_begin + plan.group_len);
    // A group that fits one chunk (rows up to kChunk values) is computed once, in pass 1, and reused by pass 2.
    const bool one_chunk = group_end - group_begin <= kChunk;
    const float* group_values = nullptr;
    // Pass 1: the group's range.
    // Over order-preserving integer keys of the floats: an integer min/max reduction vectorises, a float one does
    // not without -ffast-math.
    int32_t lo_key = std::numeric_limits<int32_t>::max(), hi_key = std::numeric_limits<int32_t>::min();
    for (int64_t begin = group_begin; begin < group_end; begin += kChunk) {
      const int64_t n = std::min(kChunk, group_end - begin);
      const float* x = source.Get(begin, n, scratch);
      group_values = x;
      uint32_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t key = OrderKey(x[i]);
        lo_key = key < lo_key ? key : lo_key;
        hi_key = key > hi_key ? key : hi_key;
        bad |= NonFiniteBit(x[i]);
      }
      if ((bad >> 31) != 0) return source.CheckFinite(begin, n, x);
    }
    const float lo = FromOrderKey(lo_key), hi = FromOrderKey(hi_key);
    const float max_abs = std::max(std::fabs(lo), std::fabs(hi));
    float scale, zero = 0;
    if (affine) {
      const double range = static_cast<double>(hi) - static_cast<double>(lo);
      if (range > std::numeric_limits<float>::max()) {
        return InvalidArgumentError("tensor " + SingleQuoted(plan.tensor->name) + ": values of scale group " +
                                    std::to_string(g) + " span [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                    "], wider than fp32 holds; use the symmetric scheme");
      }
      zero = lo;
      scale = ChooseScale(static_cast<float>(range), qmax, zero);
    } else {
      scale = ChooseScale(max_abs, qmax, 0);
    }
    scales[g] = scale;
    if (affine) zeros[g] = zero;
    // Multiplying by the inverse is faster than dividing; a scale so small its inverse overflows divides instead.
    const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
    const bool divide = scale > 0 && !std::isfinite(inverse);
    // Pass 2: levels, stored, and the residual.
    for (int64_t begin = group_begin; begin < group_end; begin += kChunk) {
      const int64_t n = std::min(kChunk, group_end - begin);
      const float* x = one_chunk ? group_values : source.Get(begin, n, scratch);
      float* r = residual ? residual + begin : nullptr;
      if (affine) {
        QuantiseAffine(x, n, zero, divide ? scale : inverse, divide, static_cast<float>(qmax), levels);
        if (r) {
          for (int64_t i = 0; i < n; ++i) r[i] = x[i] - Dequantise(levels[i], scale, zero);
        }
      } else {
        const float top = static_cast<float>(qmax);
        const int32_t offset = int4 ? 8 : 0;
        if (divide) {
          if (r) QuantiseSymmetric<true, true>(x, n, scale, inverse, top, offset, levels, r);
          if (!r) QuantiseSymmetric<true, false>(x, n, scale, inverse, top, offset, levels, r);
        } else {
          if (r) QuantiseSymmetric<false, true>(x, n, scale, inverse, top, offset, levels, r);
          if (!r) QuantiseSymmetric<false, false>(x, n, scale, inverse, top, offset, levels, r);
        }
      }
      if (!int4) {
        std::memcpy(values.data() + begin, levels, n);
      } else {
        auto* packed = reinterpret_cast<uint8_t*>(values.data());
        int64_t i = 0;
        if ((begin & 1) != 0) {  // a group that starts mid-byte: its first value is the high nibble
          packed[begin >> 1] |= static_cast<uint8_t>(levels[0] << 4);
          i = 1;
        }
        uint8_t* p = packed + ((begin + i) >> 1);
        const int64_t pairs = (n - i) / 2;
        PackNibbles(levels + i, pairs, p);
        i += 2 * pairs;
        if (i < n) p[pairs] |= levels[i];  // low nibble; the next group (or zero padding) fills the high one
      }
    }
  }
  return Status::Ok();
}

// ---- Decoder ----

// The inverse of PackNibbles: levels[2j] = in[j] & 15, levels[2j + 1] = in[j] >> 4, one u16 store per byte.
inline void UnpackNibbles(const uint8_t* in, int64_t bytes, uint8_t* levels) {
  for (int64_t j = 0; j < bytes; ++j) {
    const uint16_t w = static_cast<uint16_t>((in[j] & 0x0fu) | ((in[j] & 0xf0u) << 4));
    std::memcpy(levels + 2 * j, &w, 2);
  }
}

// Reads the image front to back.
class StreamReader {
 public:
  explicit StreamReader(const ReadBytes& read) : read_(read) {}

  Status ReadExactly(std::span<std::byte> out, const std::string& tensor, uint64_t offset, uint64_t total) {
    size_t filled = 0;
    while (filled < out.size()) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, read_(out.subspan(filled)));
      if (n == 0) {
        return InvalidArgumentError("tensor " + SingleQuoted(tensor) + " is truncated: the update ends after " +
                                    std::to_string(offset + filled) + " of its " + std::to_string(total) + " bytes");
      }
      filled += n;
    }
    return Status::Ok();
  }

  Status ExpectEnd() {
    std::byte extra[1];
    PARSYN_ASSIGN_OR_RETURN(size_t n, read_(extra));
    if (n != 0) return InvalidArgumentError("the update has trailing bytes after its last tensor");
    return Status::Ok();
  }

 private:
  const ReadBytes& read_;
};

StatusOr<Format> ParseFormat(const std::map<std::string, std::string>& metadata, const DecodeExpectations& expect) {
  for (const auto& [key, value] : metadata) {
    if (key != kCodecKey && key != kVersionKey && key != kDeltaKey && key != kSchemeKey) {
      return InvalidArgumentError("__metadata__ has unknown field " + SingleQuoted(key) + " (docs/compression.md)");
    }
  }
  auto field = [&](std::string_view key) -> StatusOr<std::string> {
    auto it = metadata.find(std::string(key));
    if (it == metadata.end()) {
      return InvalidArgumentError("__metadata__ lacks " + SingleQuoted(key) + ": not a compressed update");
    }
    return it->second;
  };
  Format format;
  PARSYN_ASSIGN_OR_RETURN(std::string codec, field(kCodecKey));
  auto parsed = ParseUpdateCodec(codec);
  if (!parsed.ok() || *parsed == UpdateCodec::kNone) {
    return InvalidArgumentError("__metadata__ codec " + SingleQuoted(codec) +
                                " is unknown; expected bf16, int8 or int4");
  }
  format.codec = *parsed;
  PARSYN_ASSIGN_OR_RETURN(std::string version, field(kVersionKey));
  if (version != kVersion) {
    return InvalidArgumentError("__metadata__ codec_version " + SingleQuoted(version) +
                                " is not supported; expected '1'");
  }
  PARSYN_ASSIGN_OR_RETURN(std::string delta, field(kDeltaKey));
  if (delta != "true" && delta != "false") {
    return InvalidArgumentError("__metadata__ delta " + SingleQuoted(delta) + " is not 'true' or 'false'");
  }
  format.delta = delta == "true";
  if (format.quantised()) {
    PARSYN_ASSIGN_OR_RETURN(std::string scheme, field(kSchemeKey));
    if (scheme != "symmetric" && scheme != "affine") {
      return InvalidArgumentError("__metadata__ scheme " + SingleQuoted(scheme) + " is not 'symmetric' or 'affine'");
    }
    format.scheme = scheme == "affine" ? QuantScheme::kAffine : QuantScheme::kSymmetric;
  } else if (metadata.contains(std::string(kSchemeKey))) {
    return InvalidArgumentError("__metadata__ has 'scheme', which the bf16 codec does not take");
  }
  if (expect.codec && *expect.codec != format.codec) {
    return InvalidArgumentError("the update uses codec " + SingleQuoted(UpdateCodecName(format.codec)) + ", expected " +
                                SingleQuoted(UpdateCodecName(*expect.codec)));
  }
  if (expect.delta && *expect.delta != format.delta) {
    return InvalidArgumentError(std::string("the update is ") + (format.delta ? "" : "not ") + "a delta, expected " +
                                (*expect.delta ? "a delta" : "full weights"));
  }
  return format;
}

// The header's tensors (in data order) against the parts the layout implies.
Status CheckParts(const std::vector<SafetensorsEntry>& got, const std::vector<TensorPlan>& plans) {
  std::vector<const Part*> want;
  for (const TensorPlan& plan : plans) {
    for (const Part& part : plan.parts) want.push_back(&part);
  }
  const size_t common = std::min(want.size(), got.size());
  for (size_t i = 0; i < common; ++i) {
    const Part& w = *want[i];
    const SafetensorsEntry& g = got[i];
    if (w.name != g.name) {
      const bool known = std::any_of(want.begin(), want.end(), [&](const Part* p) { return p->name == g.name; });
      if (!known) return InvalidArgumentError("unexpected tensor " + SingleQuoted(g.name));
      const bool present = std::any_of(got.begin(), got.end(), [&](const auto& e) { return e.name == w.name; });
      if (!present) return InvalidArgumentError("missing tensor " + SingleQuoted(w.name));
      return InvalidArgumentError("tensor #" + std::to_string(i) + " in data order is " + SingleQuoted(g.name) +
                                  ", expected " + SingleQuoted(w.name) + " (docs/compression.md gives the order)");
    }
    if (w.dtype != g.dtype) {
      return InvalidArgumentError("tensor " + SingleQuoted(g.name) + " has dtype " + std::string(DTypeName(g.dtype)) +
                                  ", expected " + std::string(DTypeName(w.dtype)));
    }
    if (w.shape != g.shape) {
      std::string why;
      if (g.name.ends_with(kScaleSuffix) || g.name.ends_with(kZeroSuffix)) {
        why = " (one per scale group of the tensor)";
      } else if (g.name.ends_with(kValuesSuffix)) {
        why = " (the packed values of the tensor)";
      }
      return InvalidArgumentError("tensor " + SingleQuoted(g.name) + " has shape " + ShapeString(g.shape) +
                                  ", expected " + ShapeString(w.shape) + why);
    }
  }
  if (got.size() != want.size()) {
    const bool fewer = got.size() < want.size();
    return InvalidArgumentError(std::string(fewer ? "missing" : "unexpected") + " tensor " +
                                SingleQuoted(fewer ? want[common]->name : got[common].name));
  }
  return Status::Ok();
}

// Writes decoded values into the output tensor: adds the global's when reconstructing a delta, rounds to the
// output's dtype, and refuses a non-finite result.
class Emitter {
 public:
  Emitter(const Tensor& out, const Tensor* global) : out_(out), global_(global) {}

  // Where to decode values [begin, begin + n) to: straight into an F32 output, else into `scratch`.
  float* Target(int64_t begin, float* scratch) const {
    return out_.dtype == DType::kF32 ? out_.as<float>().data() + begin : scratch;
  }

  // `v` is what Target returned, holding the decoded values.
  Status Emit(int64_t begin, int64_t n, float* v) {
    if (global_) {
      if (global_->dtype == DType::kF32) {
        const float* g = global_->as<float>().data() + begin;
        for (int64_t i = 0; i < n; ++i) v[i] += g[i];
      } else {
        float g[kChunk];
        LoadFloats(*global_, begin, n, g);
        for (int64_t i = 0; i < n; ++i) v[i] += g[i];
      }
    }
    uint32_t bad = 0;
    switch (out_.dtype) {
      case DType::kF32:  // v is the output
        for (int64_t i = 0; i < n; ++i) bad |= NonFiniteBit(v[i]);
        break;
      case DType::kBF16: {
        uint16_t* o = out_.as<uint16_t>().data() + begin;
        for (int64_t i = 0; i < n; ++i) {
          o[i] = Bf16FromNonNan(v[i]);  // a NaN is caught by the first term and refused
          bad |= NonFiniteBit(v[i]) | NonFiniteBitBf16(o[i]);
        }
        break;
      }
      default: {
        uint16_t* o = out_.as<uint16_t>().data() + begin;
        for (int64_t i = 0; i < n; ++i) {
          o[i] = FloatToF16(v[i]);
          bad |= (o[i] & 0x7c00) == 0x7c00 ? 0x80000000u : 0u;
        }
      }
    }
    if ((bad >> 31) == 0) return Status::Ok();
    for (int64_t i = begin; i < begin + n; ++i) {
      const float value = out_.dtype == DType::kF32 ? v[i - begin] : LoadFloat(out_, i);
      if (!std::isfinite(value) || !std::isfinite(v[i - begin])) {
        return InvalidArgumentError("tensor " + SingleQuoted(out_.name) + ": decoded value at index " +
                                    std::to_string(i) + " is not finite (" +
                                    (std::isnan(value) ? "nan"
                                     : value > 0       ? "inf"
                                                       : "-inf") +
                                    (global_ ? ", after adding the global" : "") + ")");
      }
    }
    return Status::Ok();
  }

 private:
  const Tensor& out_;
  const Tensor* global_;
};

PARSYN_HOT_LOOPS Status DecodeFloats(const TensorPlan& plan, StreamReader& reader, Emitter& emitter) {
  const Part& part = plan.parts[0];
  const size_t element = DTypeSize(part.dtype);
  alignas(64) std::byte raw[kChunk * 4];
  float scratch[kChunk];
  for (int64_t begin = 0; begin < plan.numel; begin += kChunk) {
    const int64_t n = std::min(kChunk, plan.numel - begin);
    float* values = emitter.Target(begin, scratch);
    // F32 values are read straight to where they go; BF16 ones through `raw`.
    std::byte* destination = part.dtype == DType::kF32 ? reinterpret_cast<std::byte*>(values) : raw;
    PARSYN_RETURN_IF_ERROR(
        reader.ReadExactly(std::span(destination, n * element), part.name, begin * element, part.bytes));
    if (part.dtype == DType::kBF16) {
      const auto* in = reinterpret_cast<const uint16_t*>(raw);
      for (int64_t i = 0; i < n; ++i) values[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
    }
    PARSYN_RETURN_IF_ERROR(emitter.Emit(begin, n, values));
  }
  return Status::Ok();
}

Status ReadGroupFloats(StreamReader& reader, const Part& part, std::vector<float>& out) {
  out.resize(static_cast<size_t>(part.shape[0]));
  return reader.ReadExactly(std::as_writable_bytes(std::span(out)), part.name, 0, part.bytes);
}

PARSYN_HOT_LOOPS Status DecodeQuantised(const TensorPlan& plan, const Format& format, StreamReader& reader,
                                        Emitter& emitter) {
  const int qmax = format.qmax();
  const bool affine = format.affine();
  const bool int4 = format.codec == UpdateCodec::kInt4;
  std::vector<float> scales, zeros;
  PARSYN_RETURN_IF_ERROR(ReadGroupFloats(reader, plan.parts[0], scales));
  if (affine) PARSYN_RETURN_IF_ERROR(ReadGroupFloats(reader, plan.parts[1], zeros));
  for (int64_t g = 0; g < plan.groups; ++g) {
    const float scale = scales[g];
    const std::string where = " at index " + std::to_string(g);
    if (!std::isfinite(scale)) {
      return InvalidArgumentError("tensor " + SingleQuoted(plan.parts[0].name) + " holds a non-finite scale (" +
                                  (std::isnan(scale) ? "nan" : "inf") + ")" + where);
    }
    if (scale < 0) {
      return InvalidArgumentError("tensor " + SingleQuoted(plan.parts[0].name) + " holds a negative scale (" +
                                  std::to_string(scale) + ")" + where);
    }
    const float zero = affine ? zeros[g] : 0.0f;
    if (!std::isfinite(zero)) {
      return InvalidArgumentError("tensor " + SingleQuoted(plan.parts[1].name) + " holds a non-finite value" + where);
    }
    // Dequantising is monotone in the level, so finite end points make every decoded value finite.
    if (!std::isfinite(Dequantise(static_cast<float>(qmax), scale, zero)) ||
        (!affine && !std::isfinite(Dequantise(-static_cast<float>(qmax), scale, zero)))) {
      return InvalidArgumentError("tensor " + SingleQuoted(plan.parts[0].name) + " holds a scale (" +
                                  std::to_string(scale) + ")" + where + " whose levels overflow fp32");
    }
  }

  const Part& values_part = plan.parts.back();
  alignas(64) std::byte raw[kChunk];
  int8_t levels_signed[kChunk];
  uint8_t levels[kChunk];
  float scratch[kChunk];
  // kChunk is even, so every chunk of int4 values starts at a whole byte.
  for (int64_t begin = 0; begin < plan.numel; begin += kChunk) {
    const int64_t n = std::min(kChunk, plan.numel - begin);
    float* values = emitter.Target(begin, scratch);
    const int64_t bytes = int4 ? (n + 1) / 2 : n;
    const int64_t byte_offset = int4 ? begin / 2 : begin;
    PARSYN_RETURN_IF_ERROR(reader.ReadExactly(std::span(raw, bytes), values_part.name, byte_offset, values_part.bytes));
    const auto* in = reinterpret_cast<const uint8_t*>(raw);
    if (int4) {
      UnpackNibbles(in, n / 2, levels);
      if (n % 2 != 0) {
        levels[n - 1] = in[n / 2] & 0x0f;
        if ((in[n / 2] >> 4) != 0) {
          return InvalidArgumentError("tensor " + SingleQuoted(values_part.name) +
                                      ": the padding nibble after the last value is not zero");
        }
      }
    } else {
      std::memcpy(levels, in, n);
    }
    // Symmetric levels are -qmax..qmax: int8 -128 and int4 nibble 0 are never written. Both map to 0 below, found by
    // an unsigned byte minimum (vectorises with SSE2's pminub).
    if (!affine) {
      const uint8_t flip = int4 ? 0 : 0x80;
      uint8_t smallest = 0xff;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t u = levels[i] ^ flip;
        smallest = u < smallest ? u : smallest;
        levels_signed[i] = static_cast<int8_t>(int4 ? levels[i] - 8 : levels[i]);
      }
      if (smallest == 0) {
        for (int64_t i = 0; i < n; ++i) {
          if (levels_signed[i] < -qmax) {
            return InvalidArgumentError("tensor " + SingleQuoted(values_part.name) + ": value " +
                                        std::to_string(levels_signed[i]) + " at index " + std::to_string(begin + i) +
                                        " is outside the symmetric range -" + std::to_string(qmax) + ".." +
                                        std::to_string(qmax));
          }
        }
      }
    }
    // Dequantise group by group within the chunk.
    for (int64_t i = 0; i < n;) {
      const int64_t g = (begin + i) / plan.group_len;
      const int64_t end = std::min(n, (g + 1) * plan.group_len - begin);
      const float scale = scales[g];
      if (affine) {
        const float zero = zeros[g];
        for (int64_t k = i; k < end; ++k) values[k] = Dequantise(levels[k], scale, zero);
      } else {
        for (int64_t k = i; k < end; ++k) values[k] = Dequantise(levels_signed[k], scale, 0.0f);
      }
      i = end;
    }
    PARSYN_RETURN_IF_ERROR(emitter.Emit(begin, n, values));
  }
  return Status::Ok();
}

// Decodes into `out` (the global's names and shapes; dtypes the global's or F32 for deltas).
Status DecodeInto(const ReadBytes& compressed, const WeightSet& layout, const Format* required_delta,
                  const DecodeExpectations& expect, const WeightSet* global_to_add, WeightSet& out) {
  StreamReader reader(compressed);
  auto read_header = ReadSafetensorsHeader(compressed, expect.limits);
  if (!read_header.ok() && read_header.status().code() == StatusCode::kDataLoss) {
    return InvalidArgumentError("the update is truncated: " + read_header.status().message());
  }
  PARSYN_ASSIGN_OR_RETURN(SafetensorsLayout header, std::move(read_header));
  PARSYN_ASSIGN_OR_RETURN(Format format, ParseFormat(header.metadata, expect));
  if (required_delta && !format.delta) {
    return InvalidArgumentError("the update is not a delta; its decoded delta was asked for");
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<TensorPlan> plans, Plan(layout, format));
  PARSYN_RETURN_IF_ERROR(CheckParts(header.tensors, plans));
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& plan = plans[i];
    const Tensor* global = format.delta && global_to_add ? &(*global_to_add)[i] : nullptr;
    Emitter emitter(out[i], global);
    if (plan.form == TensorPlan::kQuantised) {
      PARSYN_RETURN_IF_ERROR(DecodeQuantised(plan, format, reader, emitter));
    } else {
      PARSYN_RETURN_IF_ERROR(DecodeFloats(plan, reader, emitter));
    }
  }
  return reader.ExpectEnd();
}

// InvalidArgument unless the carried residual has the update's tensors (names and shapes), each F32.
Status CheckCarriedResidual(const WeightSet& carried, const WeightSet& update) {
  if (carried.size() != update.size()) {
    return InvalidArgumentError("the carried residual has " + std::to_string(carried.size()) + " tensors, the update " +
                                std::to_string(update.size()));
  }
  for (size_t i = 0; i < update.size(); ++i) {
    if (carried[i].name != update[i].name || carried[i].shape != update[i].shape || carried[i].dtype != DType::kF32) {
      return InvalidArgumentError("carried residual tensor " + SingleQuoted(carried[i].name) +
                                  " does not match the update's " + SingleQuoted(update[i].name) +
                                  " (F32, same shape)");
    }
  }
  return Status::Ok();
}

// Whether `compressed` (not empty) holds exactly the parts the plans encode into, in order: names, dtypes, shapes.
bool HasThePartsOf(const WeightSet& compressed, const std::vector<TensorPlan>& plans) {
  bool same = compressed.size() > 0;
  size_t k = 0;
  for (const TensorPlan& plan : plans) {
    for (const Part& part : plan.parts) {
      same = same && k < compressed.size() && compressed[k].name == part.name && compressed[k].dtype == part.dtype &&
             compressed[k].shape == part.shape;
      ++k;
    }
  }
  return same && k == compressed.size();
}

// Whether `residual` can hold the update's residual: the update's names and shapes, each F32.
bool IsResidualOf(const WeightSet& residual, const WeightSet& update) {
  return residual.size() == update.size() &&
         std::equal(update.tensors().begin(), update.tensors().end(), residual.tensors().begin(),
                    [](const Tensor& u, const Tensor& r) {
                      return u.name == r.name && u.shape == r.shape && r.dtype == DType::kF32;
                    });
}

// Replaces `compressed`'s metadata with the format's: codec, version, delta and (quantised) scheme.
void SetFormatMetadata(const Format& format, WeightSet& compressed) {
  auto& metadata = compressed.metadata();
  metadata.clear();
  metadata[std::string(kCodecKey)] = std::string(UpdateCodecName(format.codec));
  metadata[std::string(kVersionKey)] = std::string(kVersion);
  metadata[std::string(kDeltaKey)] = format.delta ? "true" : "false";
  if (format.quantised()) metadata[std::string(kSchemeKey)] = std::string(QuantSchemeName(format.scheme));
}

}  // namespace

std::string_view UpdateCodecName(UpdateCodec codec) {
  switch (codec) {
    case UpdateCodec::kNone: return "none";
    case UpdateCodec::kBf16: return "bf16";
    case UpdateCodec::kInt8: return "int8";
    case UpdateCodec::kInt4: return "int4";
  }
  return "?";
}

StatusOr<UpdateCodec> ParseUpdateCodec(std::string_view name) {
  for (UpdateCodec c : {UpdateCodec::kNone, UpdateCodec::kBf16, UpdateCodec::kInt8, UpdateCodec::kInt4}) {
    if (UpdateCodecName(c) == name) return c;
  }
  return InvalidArgumentError("unknown update codec " + SingleQuoted(name) + "; expected none, bf16, int8 or int4");
}

std::string_view QuantSchemeName(QuantScheme scheme) { return scheme == QuantScheme::kAffine ? "affine" : "symmetric"; }

Status EncodeUpdateInto(const WeightSet& update, const EncodeOptions& options, EncodedUpdate& out) {
  if (options.codec == UpdateCodec::kNone) {
    return InvalidArgumentError("codec 'none' has no encoded form: send the update as it is");
  }
  if (options.delta_from) {
    PARSYN_RETURN_IF_ERROR(options.delta_from->CheckSameLayout(update).WithContext("update against the global"));
  }
  if (options.carried_residual) PARSYN_RETURN_IF_ERROR(CheckCarriedResidual(*options.carried_residual, update));
  // Finiteness is checked on the values encoded (a non-finite input makes them non-finite), in the same pass.
  Format format{.codec = options.codec, .scheme = options.scheme, .delta = options.delta_from != nullptr};
  PARSYN_ASSIGN_OR_RETURN(std::vector<TensorPlan> plans, Plan(update, format));

  // Reuse `out`'s buffers when they already have the layout this encoding needs (fresh pages cost more than the
  // encoding itself); otherwise start over.
  const bool reuse = HasThePartsOf(out.compressed, plans);
  if (!reuse) out.compressed = WeightSet();
  // The residual is reused when it matches the update (F32, same names and shapes), also when it is the carried
  // residual itself: every chunk is read before its residual is written.
  const bool reuse_residual = options.want_residual && IsResidualOf(out.residual, update);
  if (!reuse_residual) {
    if (options.carried_residual == &out.residual && options.want_residual) {
      return InvalidArgumentError("the carried residual is the output's and does not match the update");
    }
    out.residual = WeightSet();
  }
  SetFormatMetadata(format, out.compressed);

  size_t next_part = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& plan = plans[i];
    const Tensor& t = update[i];
    std::vector<std::span<std::byte>> parts;
    for (const Part& part : plan.parts) {
      if (reuse) {
        parts.push_back(out.compressed[next_part++].data);
      } else {
        PARSYN_ASSIGN_OR_RETURN(auto bytes, out.compressed.AddZeros(part.name, part.dtype, part.shape));
        parts.push_back(bytes);
      }
    }
    // int4 packing ORs nibbles into place.
    if (reuse && format.codec == UpdateCodec::kInt4 && plan.form == TensorPlan::kQuantised) {
      std::memset(parts.back().data(), 0, parts.back().size());
    }
    float* residual = nullptr;
    if (options.want_residual) {
      std::span<std::byte> bytes;
      if (reuse_residual) {
        bytes = out.residual[i].data;
      } else {
        PARSYN_ASSIGN_OR_RETURN(bytes, out.residual.AddZeros(t.name, DType::kF32, t.shape));
      }
      residual = reinterpret_cast<float*>(bytes.data());
    }
    ValueSource source(t, options.delta_from ? &(*options.delta_from)[i] : nullptr,
                       options.carried_residual ? &(*options.carried_residual)[i] : nullptr);
    if (plan.form == TensorPlan::kQuantised) {
      auto* scales = reinterpret_cast<float*>(parts[0].data());
      auto* zeros = format.affine() ? reinterpret_cast<float*>(parts[1].data()) : nullptr;
      PARSYN_RETURN_IF_ERROR(EncodeQuantised(plan, format, source, scales, zeros, parts.back(), residual));
    } else {
      PARSYN_RETURN_IF_ERROR(EncodeFloats(plan, source, parts[0], plan.form == TensorPlan::kBf16, residual));
    }
  }
  if (!options.want_residual) out.residual = WeightSet();
  return Status::Ok();
}

StatusOr<EncodedUpdate> EncodeUpdate(const WeightSet& update, const EncodeOptions& options) {
  EncodedUpdate encoded;
  PARSYN_RETURN_IF_ERROR(EncodeUpdateInto(update, options, encoded));
  return encoded;
}

StatusOr<WeightSet> DecodeUpdate(const ReadBytes& compressed, const WeightSet& global,
                                 const DecodeExpectations& expect) {
  WeightSet out;
  for (const Tensor& t : global.tensors()) {
    PARSYN_RETURN_IF_ERROR(out.AddZeros(t.name, t.dtype, t.shape).status());
  }
  PARSYN_RETURN_IF_ERROR(DecodeInto(compressed, global, nullptr, expect, &global, out));
  return out;
}

Status DecodeUpdateInto(const ReadBytes& compressed, const WeightSet& global, WeightSet& out,
                        const DecodeExpectations& expect) {
  PARSYN_RETURN_IF_ERROR(global.CheckSameLayout(out).WithContext("the output buffer"));
  return DecodeInto(compressed, global, nullptr, expect, &global, out);
}

StatusOr<WeightSet> DecodeUpdateDelta(const ReadBytes& compressed, const WeightSet& layout,
                                      const DecodeExpectations& expect) {
  WeightSet out;
  for (const Tensor& t : layout.tensors()) {
    PARSYN_RETURN_IF_ERROR(out.AddZeros(t.name, DType::kF32, t.shape).status());
  }
  const Format delta_required{.delta = true};
  PARSYN_RETURN_IF_ERROR(DecodeInto(compressed, layout, &delta_required, expect, nullptr, out));
  return out;
}

StatusOr<uint64_t> MaxEncodedUpdateBytes(const WeightSet& layout, UpdateCodec codec) {
  // Header bound: the metadata plus, per tensor entry, its name JSON-escaped (at most 6 bytes per byte) and the
  // fixed text around it with up to 20-digit numbers; padding to 8.
  constexpr uint64_t kPerEntry = 64 + 3 * 21;
  uint64_t total = 8 + 256 + 8;
  auto add_entry = [&](const std::string& name, const std::vector<int64_t>& shape, uint64_t bytes) {
    total += 6 * name.size() + kPerEntry + 21 * shape.size() + bytes;
  };
  if (codec == UpdateCodec::kNone) {
    for (const Tensor& t : layout.tensors()) add_entry(t.name, t.shape, t.data.size());
    return total;
  }
  const Format format{.codec = codec, .scheme = QuantScheme::kAffine};
  PARSYN_ASSIGN_OR_RETURN(std::vector<TensorPlan> plans, Plan(layout, format));
  for (const TensorPlan& plan : plans) {
    for (const Part& part : plan.parts) add_entry(part.name, part.shape, part.bytes);
  }
  return total;
}

}  // namespace parsyn::weights
