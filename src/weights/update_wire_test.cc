#include "weights/update_wire.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "weights/safetensors.h"
#include "weights/zstd_stream.h"

namespace parsyn::weights {
namespace {

namespace fs = std::filesystem;

// A 2-D weight (quantised by the int codecs) and a bias (sent as F32), values around `center`.
WeightSet MakeWeights(uint32_t seed, float center) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  WeightSet set;
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"layer.weight", {64, 256}}, {"layer.bias", {64}}}) {
    std::span<std::byte> bytes = *set.AddZeros(name, DType::kF32, shape);
    std::span<float> values(reinterpret_cast<float*>(bytes.data()), bytes.size() / 4);
    for (float& v : values) v = center + noise(rng);
  }
  return set;
}

void WriteBytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

float MaxAbsDiff(const WeightSet& a, const WeightSet& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::span<const float> x = a[i].as<float>(), y = b[i].as<float>();
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
  }
  return worst;
}

// Each job setting: encoded by the worker's function, decoded by the coordinator's into the update's form, the wire
// size as expected against the plain file, and the error bounded by the codec.
TEST(UpdateWireTest, EachEncodingRoundTripsWithinItsBound) {
  test_support::TempDir dir("parsyn-update-wire");
  const WeightSet global = MakeWeights(1, 0.5f);
  WeightSet local = MakeWeights(1, 0.5f);
  for (size_t i = 0; i < local.size(); ++i) {
    for (float& v : local[i].as<float>()) v += 0.01f;  // a round of training: a small, even step
  }
  const fs::path update_file = dir.path() / "update.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(local, update_file).ok());
  const double plain_bytes = static_cast<double>(fs::file_size(update_file));
  struct Case {
    WireEncoding encoding;
    double max_ratio;  // wire / plain
    float max_error;
  };
  const std::vector<Case> cases = {
      {{.codec = UpdateCodec::kNone}, 1.0, 0},
      {{.codec = UpdateCodec::kNone, .zstd_level = 3}, 1.0, 0},
      {{.codec = UpdateCodec::kBf16}, 0.505, 0.01f},
      {{.codec = UpdateCodec::kInt8, .delta = true, .zstd_level = 3}, 0.26, 1e-3f},
      {{.codec = UpdateCodec::kInt4, .delta = true, .error_feedback = true}, 0.14, 2e-2f},
  };
  for (const Case& c : cases) {
    const std::string label = std::string(UpdateCodecName(c.encoding.codec)) + (c.encoding.delta ? "+delta" : "") +
                              "+zstd" + std::to_string(c.encoding.zstd_level);
    const fs::path wire = dir.path() / "update.wire";
    const fs::path residual = dir.path() / "residual.safetensors";
    ASSERT_TRUE(EncodeUpdateFileForWire(update_file, global, c.encoding, residual, wire).ok()) << label;
    EXPECT_LE(static_cast<double>(fs::file_size(wire)) / plain_bytes, c.max_ratio)
        << label << ": " << fs::file_size(wire) << " of " << plain_bytes << " bytes";
    EXPECT_EQ(fs::exists(residual), c.encoding.error_feedback) << label;
    StatusOr<WeightSet> decoded = DecodeUpdateFileFromWire(wire, global, c.encoding);
    ASSERT_TRUE(decoded.ok()) << label << ": " << decoded.status().ToString();
    ASSERT_TRUE(global.CheckSameLayout(*decoded).ok()) << label;
    EXPECT_LE(MaxAbsDiff(*decoded, local), c.max_error) << label;
    fs::remove(residual);
  }
}

// Error feedback: the residual file carries this round's quantisation error into the next encoding, and a residual
// of another layout (or none, as after a restart) starts from zero.
TEST(UpdateWireTest, ErrorFeedbackCarriesTheResidualBetweenRounds) {
  test_support::TempDir dir("parsyn-update-wire");
  const WeightSet global = MakeWeights(2, 0.0f);
  const fs::path update_file = dir.path() / "update.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(MakeWeights(3, 0.0f), update_file).ok());
  const WireEncoding int4{.codec = UpdateCodec::kInt4, .delta = true, .error_feedback = true};
  const fs::path residual = dir.path() / "residual.safetensors";
  const fs::path first = dir.path() / "first.wire", second = dir.path() / "second.wire";
  ASSERT_TRUE(EncodeUpdateFileForWire(update_file, global, int4, residual, first).ok());
  StatusOr<WeightSet> carried = ReadSafetensorsFile(residual);
  ASSERT_TRUE(carried.ok());
  float largest = 0;
  for (float v : (*carried)[0].as<float>()) largest = std::max(largest, std::abs(v));
  EXPECT_GT(largest, 0.0f) << "int4 leaves a quantisation error to carry";
  ASSERT_TRUE(EncodeUpdateFileForWire(update_file, global, int4, residual, second).ok());
  std::ifstream a(first, std::ios::binary), b(second, std::ios::binary);
  const std::string first_bytes((std::istreambuf_iterator<char>(a)), {}),
      second_bytes((std::istreambuf_iterator<char>(b)), {});
  EXPECT_NE(first_bytes, second_bytes) << "the carried residual changes what is sent";

  // A residual of another layout is dropped: the encoding is the same as with none at all.
  WeightSet other;
  ASSERT_TRUE(other.AddZeros("something.else", DType::kF32, {3}).ok());
  ASSERT_TRUE(WriteSafetensorsFile(other, residual).ok());
  const fs::path third = dir.path() / "third.wire";
  ASSERT_TRUE(EncodeUpdateFileForWire(update_file, global, int4, residual, third).ok());
  std::ifstream c(third, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(c)), {}), first_bytes);
}

// What the coordinator refuses before it counts: a zstd frame that expands past what the layout allows (refused from
// its header), a truncated frame, and a compressed update of another codec than the job's.
TEST(UpdateWireTest, DecodingRefusesBombsTruncationAndTheWrongCodec) {
  test_support::TempDir dir("parsyn-update-wire");
  const WeightSet global = MakeWeights(4, 0.0f);
  const WireEncoding int8_zstd{.codec = UpdateCodec::kInt8, .zstd_level = 3};
  const fs::path wire = dir.path() / "update.wire";

  StatusOr<std::vector<std::byte>> bomb = ZstdCompress(std::vector<std::byte>(size_t{64} << 20), 3);
  ASSERT_TRUE(bomb.ok());
  ASSERT_LT(bomb->size(), size_t{64} << 10);
  WriteBytes(wire, *bomb);
  StatusOr<WeightSet> decoded = DecodeUpdateFileFromWire(wire, global, int8_zstd);
  ASSERT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("declares"), std::string::npos) << decoded.status().ToString();
  decoded = DecodeUpdateFileFromWire(wire, global, {.codec = UpdateCodec::kNone, .zstd_level = 3});
  ASSERT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("declares"), std::string::npos) << decoded.status().ToString();

  StatusOr<EncodedUpdate> encoded = EncodeUpdate(MakeWeights(5, 0.0f), {.codec = UpdateCodec::kInt8});
  ASSERT_TRUE(encoded.ok());
  StatusOr<std::vector<std::byte>> frame = ZstdCompress(SerializeSafetensors(encoded->compressed), 3);
  ASSERT_TRUE(frame.ok());
  WriteBytes(wire, std::span(*frame).first(frame->size() - 5));
  decoded = DecodeUpdateFileFromWire(wire, global, int8_zstd);
  ASSERT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("truncated"), std::string::npos) << decoded.status().ToString();

  WriteBytes(wire, *frame);
  EXPECT_TRUE(DecodeUpdateFileFromWire(wire, global, int8_zstd).ok());
  decoded = DecodeUpdateFileFromWire(wire, global, {.codec = UpdateCodec::kInt4, .zstd_level = 3});
  EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument) << decoded.status().ToString();
}

// A global's zstd copy: back to the same bytes, and bounded by the size the task names.
TEST(UpdateWireTest, ZstdFilesRoundTripWithinTheirBound) {
  test_support::TempDir dir("parsyn-update-wire");
  const fs::path plain = dir.path() / "global.safetensors", compressed = dir.path() / "global.zst",
                 back = dir.path() / "back.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(MakeWeights(6, 1.0f), plain).ok());
  StatusOr<uint64_t> size = ZstdCompressFile(plain, compressed, 3);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, fs::file_size(compressed));
  ASSERT_TRUE(ZstdDecompressFile(compressed, back, fs::file_size(plain)).ok());
  std::ifstream a(plain, std::ios::binary), b(back, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(a)), {}), std::string((std::istreambuf_iterator<char>(b)), {}));
  Status too_small = ZstdDecompressFile(compressed, back, fs::file_size(plain) - 1);
  EXPECT_EQ(too_small.code(), StatusCode::kInvalidArgument) << too_small.ToString();
  EXPECT_FALSE(fs::exists(back));
}

}  // namespace
}  // namespace parsyn::weights
