#include "weights/update_codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "weights/safetensors.h"
#include "weights/zstd_stream.h"

namespace parsyn::weights {
namespace {

constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kTiny = std::numeric_limits<float>::denorm_min();

struct CodecSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Fills a tensor row by row; each row gets its own magnitude from `row_scale`.
WeightSet MakeSet(const std::vector<CodecSpec>& specs, uint32_t seed, const std::function<float(int64_t)>& row_scale,
                  DType dtype = DType::kF32) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  WeightSet set;
  for (const CodecSpec& spec : specs) {
    auto bytes = set.AddZeros(spec.name, dtype, spec.shape);
    EXPECT_TRUE(bytes.ok());
    const int64_t numel = *NumElements(spec.shape);
    const int64_t cols = spec.shape.size() >= 2 && spec.shape[0] > 0 ? numel / spec.shape[0] : numel;
    for (int64_t i = 0; i < numel; ++i) {
      const float v = unit(rng) * row_scale(cols > 0 ? i / cols : 0);
      if (dtype == DType::kF32) {
        std::memcpy(bytes->data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = FloatToBf16(v);
        std::memcpy(bytes->data() + 2 * i, &h, 2);
      }
    }
  }
  return set;
}

std::vector<std::byte> Serialize(const WeightSet& set) { return SerializeSafetensors(set); }

StatusOr<WeightSet> Decode(std::span<const std::byte> image, const WeightSet& global,
                           const DecodeExpectations& expect = {}) {
  return DecodeUpdate(ReadFromSpan(image), global, expect);
}

float At(const Tensor& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.as<float>()[i] : Bf16ToFloat(t.as<uint16_t>()[i]);
}

// bf16 by an independent rule: of the two bf16 neighbours of f (in double), the nearer; on a tie, the even one.
uint16_t ReferenceBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t down = bits & 0xffff0000u;
  const uint32_t up = down + 0x10000u;
  auto value = [](uint32_t b) {
    if ((b & 0x7fffffffu) == 0x7f800000u) return std::copysign(std::ldexp(1.0, 128), std::bit_cast<float>(b));
    return static_cast<double>(std::bit_cast<float>(b));
  };
  const double d_down = std::fabs(static_cast<double>(f) - value(down));
  const double d_up = std::fabs(value(up) - static_cast<double>(f));
  if (d_down < d_up) return static_cast<uint16_t>(down >> 16);
  if (d_up < d_down) return static_cast<uint16_t>(up >> 16);
  return static_cast<uint16_t>(((down >> 16) & 1) == 0 ? down >> 16 : up >> 16);
}

// Values per scale group as docs/compression.md states it.
int64_t GroupLength(const std::vector<int64_t>& shape) {
  const int64_t cols = *NumElements(shape) / shape[0];
  return cols >= 64 ? cols : (64 + cols - 1) / cols * cols;
}

TEST(UpdateCodec, Bf16IsRoundToNearestEvenBitExact) {
  WeightSet update;
  std::vector<float> values = {
      0.0f, -0.0f, 1.0f, kTiny, -kTiny, 1e-40f, 3.0e38f, -3.0e38f, 1.00390625f, 1.01171875f, 1.0f + 0x1p-8f + 0x1p-20f};
  for (uint32_t m : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x00008000u, 0x00018000u}) {
    values.push_back(std::bit_cast<float>(m));  // exact ties, both parities
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 100'000; ++i) {
    float f;
    do {
      f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    } while (!std::isfinite(f) || std::fabs(f) > 3.38e38f);
    values.push_back(f);
  }
  ASSERT_TRUE(
      update.Add("w", DType::kF32, {static_cast<int64_t>(values.size())}, std::as_bytes(std::span(values))).ok());
  auto encoded = EncodeUpdate(update, {.codec = UpdateCodec::kBf16});
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  auto decoded = Decode(Serialize(encoded->compressed), update);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t want = ReferenceBf16(values[i]);
    ASSERT_EQ(encoded->compressed[0].as<uint16_t>()[i], want) << "value " << values[i];
    ASSERT_EQ(std::bit_cast<uint32_t>((*decoded)[0].as<float>()[i]), static_cast<uint32_t>(want) << 16);
  }
  // Decoding into a reused buffer gives the same bytes; a buffer of another layout is refused.
  WeightSet reused = update.Clone();
  ASSERT_TRUE(DecodeUpdateInto(ReadFromSpan(Serialize(encoded->compressed)), update, reused).ok());
  EXPECT_EQ(std::memcmp(reused[0].data.data(), (*decoded)[0].data.data(), reused[0].data.size()), 0);
  WeightSet wrong;
  ASSERT_TRUE(wrong.AddZeros("w", DType::kBF16, update[0].shape).ok());
  Status refused_buffer = DecodeUpdateInto(ReadFromSpan(Serialize(encoded->compressed)), update, wrong);
  EXPECT_NE(refused_buffer.message().find("the output buffer: tensor 'w' has dtype BF16, expected F32"),
            std::string::npos)
      << refused_buffer.ToString();
  // A finite value that rounds to infinity in bf16 is refused by the encoder, not sent.
  WeightSet big;
  const float huge[] = {1.0f, kMax};
  ASSERT_TRUE(big.Add("w", DType::kF32, {2}, std::as_bytes(std::span(huge))).ok());
  auto refused = EncodeUpdate(big, {.codec = UpdateCodec::kBf16});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tensor 'w': the value at index 1 overflows bf16"), std::string::npos)
      << refused.status().ToString();
}

// Shapes with odd row lengths, rows shorter than a scale group, rows longer than the codec's 4096-value chunk (a group
// encoded in several chunks), an empty tensor and 1-D/0-D tensors; rows with zero, tiny (subnormal), small and huge
// magnitudes.
const std::vector<CodecSpec> kShapes = {{"a", {7, 129}}, {"b", {33, 17}},   {"c", {5, 3}},
                                        {"d", {64, 64}}, {"e", {9}},        {"f", {}},
                                        {"g", {0, 4}},   {"h", {3, 2, 65}}, {"i", {7, 4099}}};
float RowScale(int64_t row) {
  switch (row % 6) {
    case 0: return 0.0f;
    case 1: return 1e-41f;
    case 2: return 1e-20f;
    case 3: return 1e30f;
    case 4: return 3.0e38f / 1.5f;
    default: return 0.05f;
  }
}

TEST(UpdateCodec, QuantisedValuesAreWithinHalfAScaleOfTheTruth) {
  for (UpdateCodec codec : {UpdateCodec::kInt8, UpdateCodec::kInt4}) {
    for (QuantScheme scheme : {QuantScheme::kSymmetric, QuantScheme::kAffine}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(UpdateCodecName(codec)) + " " + std::string(QuantSchemeName(scheme)) + " " +
                     std::string(DTypeName(dtype)));
        // Affine groups must span less than fp32's range: the huge rows are smaller there.
        const bool affine = scheme == QuantScheme::kAffine;
        const WeightSet update = MakeSet(
            kShapes, 21, [&](int64_t r) { return affine && r % 6 == 4 ? 1e37f : RowScale(r); }, dtype);
        auto encoded = EncodeUpdate(update, {.codec = codec, .scheme = scheme});
        ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
        const std::vector<std::byte> image = Serialize(encoded->compressed);
        auto decoded = Decode(image, update);
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        for (size_t k = 0; k < update.size(); ++k) {
          const Tensor& truth = update[k];
          const Tensor& got = (*decoded)[k];
          const Tensor* scales = encoded->compressed.Find(truth.name + ".__scale");
          if (truth.shape.size() <= 1 || truth.numel() == 0) {  // sent as F32 values: exact
            ASSERT_EQ(scales, nullptr);
            EXPECT_EQ(std::memcmp(truth.data.data(), got.data.data(), truth.data.size()), 0) << truth.name;
            continue;
          }
          ASSERT_NE(scales, nullptr) << truth.name;
          const int64_t group_len = GroupLength(truth.shape);
          ASSERT_EQ(scales->numel(), (truth.numel() + group_len - 1) / group_len) << truth.name;
          const Tensor* zeros = encoded->compressed.Find(truth.name + ".__zero");
          ASSERT_EQ(zeros != nullptr, affine);
          for (int64_t i = 0; i < truth.numel(); ++i) {
            const float x = At(truth, i), d = At(got, i);
            const float s = scales->as<float>()[i / group_len];
            const double zero = affine ? std::fabs(zeros->as<float>()[i / group_len]) : 0.0;
            // Half a scale, plus fp32 rounding of the scale's inverse and of zero + q * scale.
            double bound = s / 2.0 + 0x1p-21 * (std::fabs(x) + zero + s * 255.0) + 2 * kTiny;
            // Rounding the decoded value back to a bf16 tensor adds half a bf16 ulp.
            if (dtype == DType::kBF16) bound += std::fabs(d) * 0x1p-8;
            ASSERT_LE(std::fabs(static_cast<double>(x) - d), bound)
                << truth.name << "[" << i << "] = " << x << " decoded " << d << " scale " << s;
            if (x == 0 && !affine) {
              ASSERT_EQ(d, 0.0f);  // zero rows stay exactly zero
            }
          }
        }
      }
    }
  }
}

TEST(UpdateCodec, CompressedSizesAreAsTheFormatStates) {
  const WeightSet update =
      MakeSet({{"w", {256, 1024}}, {"lora_b", {1024, 8}}, {"bias", {1024}}}, 3, [](int64_t) { return 0.1f; });
  const uint64_t fp32 = update.total_bytes();
  struct Want {
    UpdateCodec codec;
    QuantScheme scheme;
    uint64_t bytes;
  };
  // w: 256 scales; lora_b: rows of 8 grouped by 8 -> 128 scales; bias: F32 values.
  const std::vector<Want> wants = {
      {UpdateCodec::kBf16, QuantScheme::kSymmetric, fp32 / 2},
      {UpdateCodec::kInt8, QuantScheme::kSymmetric, 256 * 1024 + 256 * 4 + 8192 + 128 * 4 + 4096},
      {UpdateCodec::kInt8, QuantScheme::kAffine, 256 * 1024 + 256 * 8 + 8192 + 128 * 8 + 4096},
      {UpdateCodec::kInt4, QuantScheme::kSymmetric, 128 * 1024 + 256 * 4 + 4096 + 128 * 4 + 4096},
  };
  for (const Want& want : wants) {
    auto encoded = EncodeUpdate(update, {.codec = want.codec, .scheme = want.scheme});
    ASSERT_TRUE(encoded.ok());
    EXPECT_EQ(encoded->compressed.total_bytes(), want.bytes) << UpdateCodecName(want.codec);
    auto bound = MaxEncodedUpdateBytes(update, want.codec);
    ASSERT_TRUE(bound.ok());
    EXPECT_LE(Serialize(encoded->compressed).size(), *bound);
    EXPECT_LE(*bound, want.bytes + 4096 + (want.scheme == QuantScheme::kSymmetric ? 1536 : 0));
  }
  EXPECT_LE(Serialize(update).size(), *MaxEncodedUpdateBytes(update, UpdateCodec::kNone));
}

TEST(UpdateCodec, DeltaRoundTripReconstructsOrYieldsTheDelta) {
  const std::vector<CodecSpec> specs = {{"w", {16, 100}}, {"norm", {100}}};
  const WeightSet global = MakeSet(specs, 1, [](int64_t) { return 1.0f; });
  const WeightSet noise = MakeSet(specs, 2, [](int64_t) { return 1e-3f; });
  WeightSet update = global.Clone();
  for (size_t k = 0; k < update.size(); ++k) {
    for (int64_t i = 0; i < update[k].numel(); ++i) update[k].as<float>()[i] += noise[k].as<float>()[i];
  }
  for (UpdateCodec codec : {UpdateCodec::kBf16, UpdateCodec::kInt8, UpdateCodec::kInt4}) {
    SCOPED_TRACE(UpdateCodecName(codec));
    auto encoded = EncodeUpdate(update, {.codec = codec, .delta_from = &global});
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    EXPECT_EQ(encoded->compressed.metadata().at("delta"), "true");
    const std::vector<std::byte> image = Serialize(encoded->compressed);
    auto reconstructed = Decode(image, global, {.delta = true});
    ASSERT_TRUE(reconstructed.ok()) << reconstructed.status().ToString();
    auto delta = DecodeUpdateDelta(ReadFromSpan(image), global);
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    // The delta's range is 1e-3: int4's half scale is 1e-3 / 14, far below the weights' own magnitude of 1.
    const double tolerance = codec == UpdateCodec::kInt4 ? 1e-3 / 14 + 1e-6 : 1e-3 / 254 + 1e-6;
    for (size_t k = 0; k < update.size(); ++k) {
      for (int64_t i = 0; i < update[k].numel(); ++i) {
        const float g = global[k].as<float>()[i], u = update[k].as<float>()[i];
        const float d = (*delta)[k].as<float>()[i];
        ASSERT_EQ((*reconstructed)[k].as<float>()[i], g + d);  // reconstruction is global + decoded delta
        ASSERT_NEAR(d, u - g, tolerance) << update[k].name << "[" << i << "]";
      }
    }
  }
  // A full-weights update has no delta to yield.
  auto full = EncodeUpdate(update, {.codec = UpdateCodec::kInt8});
  auto refused = DecodeUpdateDelta(ReadFromSpan(Serialize(full->compressed)), global);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not a delta"), std::string::npos);
  auto mismatch = Decode(Serialize(full->compressed), global, {.delta = true});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("expected a delta"), std::string::npos);
}

TEST(UpdateCodec, ErrorFeedbackResidualPlusDecodedIsTheEncodedValueExactly) {
  // "wide": groups longer than the codec's 4096-value chunk, read once per pass instead of once per group.
  const std::vector<CodecSpec> specs = {{"w", {12, 70}}, {"b", {33, 5}}, {"norm", {70}}, {"wide", {3, 4133}}};
  const WeightSet global = MakeSet(specs, 5, [](int64_t r) { return r % 3 == 0 ? 0.0f : 0.5f; });
  WeightSet round1 = MakeSet(specs, 6, [](int64_t r) { return 0.5f + 0.01f * r; });
  WeightSet round2 = MakeSet(specs, 7, [](int64_t r) { return 0.5f + 0.02f * r; });
  for (UpdateCodec codec : {UpdateCodec::kBf16, UpdateCodec::kInt8, UpdateCodec::kInt4}) {
    for (QuantScheme scheme : {QuantScheme::kSymmetric, QuantScheme::kAffine}) {
      if (codec == UpdateCodec::kBf16 && scheme == QuantScheme::kAffine) continue;
      SCOPED_TRACE(std::string(UpdateCodecName(codec)) + " " + std::string(QuantSchemeName(scheme)));
      const EncodeOptions options{.codec = codec, .scheme = scheme, .delta_from = &global, .want_residual = true};
      auto first = EncodeUpdate(round1, options);
      ASSERT_TRUE(first.ok()) << first.status().ToString();
      EncodeOptions carried = options;
      carried.carried_residual = &first->residual;
      auto second = EncodeUpdate(round2, carried);
      ASSERT_TRUE(second.ok()) << second.status().ToString();
      // The same two rounds through one reused EncodedUpdate, its residual carried in place: identical bytes.
      EncodedUpdate reused;
      ASSERT_TRUE(EncodeUpdateInto(round1, options, reused).ok());
      EncodeOptions in_place = options;
      in_place.carried_residual = &reused.residual;
      ASSERT_TRUE(EncodeUpdateInto(round2, in_place, reused).ok());
      EXPECT_TRUE(Serialize(reused.compressed) == Serialize(second->compressed));
      EXPECT_TRUE(Serialize(reused.residual) == Serialize(second->residual));
      auto delta1 = DecodeUpdateDelta(ReadFromSpan(Serialize(first->compressed)), global);
      auto delta2 = DecodeUpdateDelta(ReadFromSpan(Serialize(second->compressed)), global);
      ASSERT_TRUE(delta1.ok() && delta2.ok());
      bool any_residual = false;
      for (size_t k = 0; k < global.size(); ++k) {
        for (int64_t i = 0; i < global[k].numel(); ++i) {
          const float g = global[k].as<float>()[i];
          const float x1 = round1[k].as<float>()[i] - g;
          const float r1 = first->residual[k].as<float>()[i];
          const float x2 = (round2[k].as<float>()[i] - g) + r1;  // round 2 sends its delta plus round 1's residual
          const float r2 = second->residual[k].as<float>()[i];
          const float d1 = (*delta1)[k].as<float>()[i], d2 = (*delta2)[k].as<float>()[i];
          any_residual |= r1 != 0;
          if (scheme == QuantScheme::kSymmetric) {  // exact: x - d is exact in fp32 (Sterbenz) for these codecs
            ASSERT_EQ(d1 + r1, x1) << global[k].name << "[" << i << "]";
            ASSERT_EQ(d2 + r2, x2) << global[k].name << "[" << i << "]";
          } else {  // affine: one fp32 rounding of x - d
            ASSERT_LE(std::fabs(d1 + r1 - x1), (std::fabs(x1) + std::fabs(d1)) * 0x1p-23f + kTiny);
            ASSERT_LE(std::fabs(d2 + r2 - x2), (std::fabs(x2) + std::fabs(d2)) * 0x1p-23f + kTiny);
          }
          if (codec != UpdateCodec::kBf16 && global[k].shape.size() == 1) {
            ASSERT_EQ(r1, 0.0f);  // 1-D tensors are sent exactly
          }
        }
      }
      EXPECT_TRUE(any_residual);
    }
  }
}

TEST(UpdateCodec, EncoderRefusesWhatCannotBeSent) {
  const WeightSet update = MakeSet({{"w", {4, 64}}}, 1, [](int64_t) { return 1.0f; });
  const WeightSet other = MakeSet({{"w", {4, 65}}}, 1, [](int64_t) { return 1.0f; });
  WeightSet ints;
  ASSERT_TRUE(ints.AddZeros("steps", DType::kI64, {2}).ok());
  WeightSet wide;
  const float span[] = {-3e38f, 3e38f, 0, 0};
  ASSERT_TRUE(wide.Add("w", DType::kF32, {2, 2}, std::as_bytes(std::span(span))).ok());
  WeightSet big_update = update.Clone(), big_global = update.Clone();
  for (int64_t i = 0; i < 256; ++i) {
    big_update[0].as<float>()[i] = 3e38f;
    big_global[0].as<float>()[i] = -3e38f;
  }
  struct Case {
    const char* what;
    StatusOr<EncodedUpdate> result;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"codec none", EncodeUpdate(update, {.codec = UpdateCodec::kNone}), "no encoded form"});
  cases.push_back({"layout", EncodeUpdate(update, {.delta_from = &other}), "has shape [4, 64], expected [4, 65]"});
  cases.push_back({"dtype", EncodeUpdate(ints, {}), "tensor 'steps' has dtype I64"});
  cases.push_back({"affine range", EncodeUpdate(wide, {.scheme = QuantScheme::kAffine}), "use the symmetric"});
  cases.push_back({"delta overflow", EncodeUpdate(big_update, {.delta_from = &big_global}), "overflowed"});
  WeightSet nan_update = update.Clone();
  nan_update[0].as<float>()[3] = std::nanf("");
  cases.push_back({"nan", EncodeUpdate(nan_update, {}), "tensor 'w': the value to encode at index 3 is not finite"});
  cases.push_back({"nan bf16", EncodeUpdate(nan_update, {.codec = UpdateCodec::kBf16}), "index 3 is not finite"});
  cases.push_back({"residual layout", EncodeUpdate(update, {.carried_residual = &other}), "does not match"});
  for (Case& c : cases) {
    ASSERT_FALSE(c.result.ok()) << c.what;
    EXPECT_EQ(c.result.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(c.result.status().message().find(c.message), std::string::npos)
        << c.what << ": " << c.result.status().ToString();
  }
}

// ---- The malformed-compressed-update table ----

struct Malformed {
  const char* what;
  // Changes a valid int8 (or as `codec` says) compressed set, or its serialised image.
  std::function<void(WeightSet&)> edit_set;
  std::function<void(std::vector<std::byte>&)> edit_image;
  const char* message;
  UpdateCodec codec = UpdateCodec::kInt8;
  QuantScheme scheme = QuantScheme::kSymmetric;
};

// A copy of `set` with tensor `name` replaced by (dtype, shape, bytes).
WeightSet Replace(const WeightSet& set, const std::string& name, DType dtype, std::vector<int64_t> shape,
                  std::vector<std::byte> bytes) {
  WeightSet out;
  out.metadata() = set.metadata();
  for (const Tensor& t : set.tensors()) {
    if (t.name == name) {
      EXPECT_TRUE(out.Add(name, dtype, shape, bytes).ok());
    } else {
      EXPECT_TRUE(out.Add(t.name, t.dtype, t.shape, t.data).ok());
    }
  }
  return out;
}

TEST(UpdateCodec, MalformedCompressedUpdatesAreRefusedNamingTheTensor) {
  const std::vector<CodecSpec> specs = {{"w", {4, 64}}, {"odd", {3, 33}}, {"bias", {8}}};
  const WeightSet global = MakeSet(specs, 1, [](int64_t) { return 1.0f; });
  const WeightSet update = MakeSet(specs, 2, [](int64_t) { return 1.0f; });
  auto set_scale = [](float value) {
    return [value](WeightSet& set) { set.Find("w.__scale")->as<float>()[2] = value; };
  };
  const std::vector<Malformed> cases = {
      {"wrong scales shape",
       [](WeightSet& set) { set = Replace(set, "w.__scale", DType::kF32, {3}, std::vector<std::byte>(12)); }, nullptr,
       "tensor 'w.__scale' has shape [3], expected [4] (one per scale group"},
      {"scales of the wrong dtype",
       [](WeightSet& set) { set = Replace(set, "w.__scale", DType::kF16, {4}, std::vector<std::byte>(8)); }, nullptr,
       "tensor 'w.__scale' has dtype F16, expected F32"},
      {"NaN scale", set_scale(std::nanf("")), nullptr, "tensor 'w.__scale' holds a non-finite scale (nan) at index 2"},
      {"infinite scale", set_scale(INFINITY), nullptr, "tensor 'w.__scale' holds a non-finite scale (inf)"},
      {"negative scale", set_scale(-0.5f), nullptr, "tensor 'w.__scale' holds a negative scale"},
      {"scale whose levels overflow", set_scale(kMax), nullptr, "whose levels overflow fp32"},
      {"affine zero point not finite", [](WeightSet& set) { set.Find("w.__zero")->as<float>()[1] = INFINITY; }, nullptr,
       "tensor 'w.__zero' holds a non-finite value at index 1", UpdateCodec::kInt8, QuantScheme::kAffine},
      {"symmetric int8 level -128", [](WeightSet& set) { set.Find("odd.__q")->as<int8_t>()[40] = -128; }, nullptr,
       "tensor 'odd.__q': value -128 at index 40 is outside the symmetric range -127..127"},
      {"symmetric int4 nibble 0", [](WeightSet& set) { set.Find("w.__q")->as<uint8_t>()[7] &= 0xf0; }, nullptr,
       "tensor 'w.__q': value -8 at index 14", UpdateCodec::kInt4},
      {"int4 padding nibble set", [](WeightSet& set) { set.Find("odd.__q")->as<uint8_t>()[49] |= 0x30; }, nullptr,
       "tensor 'odd.__q': the padding nibble after the last value is not zero", UpdateCodec::kInt4},
      {"packed values one byte short",
       [](WeightSet& set) { set = Replace(set, "w.__q", DType::kU8, {127}, std::vector<std::byte>(127)); }, nullptr,
       "tensor 'w.__q' has shape [127], expected [128] (the packed values", UpdateCodec::kInt4},
      {"truncated packed data", nullptr, [](std::vector<std::byte>& image) { image.resize(image.size() - 20); },
       "tensor 'bias' is truncated: the update ends after 12 of its 32 bytes"},
      {"truncated inside the values", nullptr,
       [](std::vector<std::byte>& image) { image.resize(image.size() - 32 - 99 - 8 - 100); },
       "tensor 'w.__q' is truncated: the update ends after 156 of its 256 bytes"},
      {"trailing bytes", nullptr, [](std::vector<std::byte>& image) { image.resize(image.size() + 8); },
       "trailing bytes after its last tensor"},
      {"unknown codec", [](WeightSet& set) { set.metadata()["codec"] = "int2"; }, nullptr,
       "__metadata__ codec 'int2' is unknown"},
      {"codec none", [](WeightSet& set) { set.metadata()["codec"] = "none"; }, nullptr,
       "__metadata__ codec 'none' is unknown"},
      {"unknown metadata field", [](WeightSet& set) { set.metadata()["format"] = "pt"; }, nullptr,
       "__metadata__ has unknown field 'format'"},
      {"no metadata", [](WeightSet& set) { set.metadata().clear(); }, nullptr, "lacks 'codec': not a compressed"},
      {"future version", [](WeightSet& set) { set.metadata()["codec_version"] = std::string("2"); }, nullptr,
       "codec_version '2' is not supported"},
      {"bad delta flag", [](WeightSet& set) { set.metadata()["delta"] = "yes"; }, nullptr,
       "__metadata__ delta 'yes' is not 'true' or 'false'"},
      {"unknown scheme", [](WeightSet& set) { set.metadata()["scheme"] = "log"; }, nullptr,
       "__metadata__ scheme 'log' is not"},
      {"scheme on bf16", [](WeightSet& set) { set.metadata()["scheme"] = "symmetric"; }, nullptr,
       "the bf16 codec does not take", UpdateCodec::kBf16},
      {"metadata says int4, tensors are int8", [](WeightSet& set) { set.metadata()["codec"] = "int4"; }, nullptr,
       "tensor 'w.__q' has dtype I8, expected U8"},
      {"missing tensor",
       [](WeightSet& set) {
         WeightSet out;
         out.metadata() = set.metadata();
         for (const Tensor& t : set.tensors()) {
           if (t.name != "bias") {
             EXPECT_TRUE(out.Add(t.name, t.dtype, t.shape, t.data).ok());
           }
         }
         set = std::move(out);
       },
       nullptr, "missing tensor 'bias'"},
      {"extra tensor", [](WeightSet& set) { EXPECT_TRUE(set.AddZeros("extra", DType::kF32, {1}).ok()); }, nullptr,
       "unexpected tensor 'extra'"},
      {"bf16 value that is not finite", [](WeightSet& set) { set.Find("w")->as<uint16_t>()[5] = 0x7fc0; }, nullptr,
       "tensor 'w': decoded value at index 5 is not finite (nan)", UpdateCodec::kBf16},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    auto encoded = EncodeUpdate(update, {.codec = c.codec, .scheme = c.scheme});
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    ASSERT_TRUE(Decode(Serialize(encoded->compressed), global).ok());  // valid before the edit
    if (c.edit_set) c.edit_set(encoded->compressed);
    std::vector<std::byte> image = Serialize(encoded->compressed);
    if (c.edit_image) c.edit_image(image);
    auto decoded = Decode(image, global);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument) << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find(c.message), std::string::npos) << decoded.status().ToString();
  }
}

TEST(UpdateCodec, LayoutAndExpectationMismatchesAreRefused) {
  const WeightSet global = MakeSet({{"w", {4, 64}}, {"bias", {8}}}, 1, [](int64_t) { return 1.0f; });
  const WeightSet other = MakeSet({{"w", {5, 64}}, {"bias", {8}}}, 1, [](int64_t) { return 1.0f; });
  const WeightSet renamed = MakeSet({{"v", {4, 64}}, {"bias", {8}}}, 1, [](int64_t) { return 1.0f; });
  auto encoded = EncodeUpdate(global, {.codec = UpdateCodec::kInt8});
  const std::vector<std::byte> image = Serialize(encoded->compressed);
  struct Case {
    const char* what;
    StatusOr<WeightSet> result;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"another shape", Decode(image, other), "tensor 'w.__scale' has shape [4], expected [5]"});
  cases.push_back({"another name", Decode(image, renamed), "unexpected tensor 'w.__scale'"});
  cases.push_back({"expected another codec", Decode(image, global, {.codec = UpdateCodec::kInt4}),
                   "uses codec 'int8', expected 'int4'"});
  cases.push_back({"a plain update", Decode(Serialize(global), global), "lacks 'codec'"});
  for (Case& c : cases) {
    ASSERT_FALSE(c.result.ok()) << c.what;
    EXPECT_EQ(c.result.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(c.result.status().message().find(c.message), std::string::npos)
        << c.what << ": " << c.result.status().ToString();
  }
}

// The wire path: encode, serialise, zstd, then decode straight out of the decompressing stream.
TEST(UpdateCodec, StreamsThroughZstdAndRefusesATruncatedFrameOrABomb) {
  const std::vector<CodecSpec> specs = {{"w", {64, 300}}, {"bias", {300}}};
  const WeightSet global = MakeSet(specs, 1, [](int64_t) { return 1.0f; });
  const WeightSet update = MakeSet(specs, 2, [](int64_t) { return 1.0f; });
  auto encoded = EncodeUpdate(update, {.codec = UpdateCodec::kInt4, .delta_from = &global});
  const std::vector<std::byte> image = Serialize(encoded->compressed);
  auto compressed = ZstdCompress(image, 3);
  ASSERT_TRUE(compressed.ok());
  const uint64_t limit = *MaxEncodedUpdateBytes(global, UpdateCodec::kInt4);
  {
    ZstdDecompressReader reader(ReadFromSpan(*compressed), limit);
    auto streamed = DecodeUpdate(ReadFrom(reader), global);
    ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
    auto direct = Decode(image, global);
    EXPECT_EQ(std::memcmp((*streamed)[0].data.data(), (*direct)[0].data.data(), (*direct)[0].data.size()), 0);
  }
  {
    std::vector<std::byte> cut(compressed->begin(), compressed->end() - 3);
    ZstdDecompressReader reader(ReadFromSpan(cut), limit);
    auto refused = DecodeUpdate(ReadFrom(reader), global);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("zstd stream is truncated"), std::string::npos)
        << refused.status().ToString();
  }
  {
    // A valid update padded with a long run of zero bytes: its frame declares more than the layout allows.
    std::vector<std::byte> padded = image;
    padded.resize(image.size() + (size_t{32} << 20));
    auto bomb = ZstdCompress(padded, 3);
    ASSERT_LT(bomb->size(), size_t{64} << 10);
    ZstdDecompressReader reader(ReadFromSpan(*bomb), limit);
    auto refused = DecodeUpdate(ReadFrom(reader), global);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("refused before expanding it"), std::string::npos)
        << refused.status().ToString();
    EXPECT_EQ(reader.bytes_out(), 0u);
    EXPECT_LE(reader.peak_zstd_allocated_bytes(), 128u << 10);  // zstd's context alone: no window was allocated
  }
}

}  // namespace
}  // namespace parsyn::weights
