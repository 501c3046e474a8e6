#include "weights/safetensors_stream_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace parsyn::weights {
namespace {

// Tensors of every checked dtype and one that is not checked, with values that are all finite.
WeightSet MixedSet() {
  WeightSet set;
  auto f32 = set.AddZeros("f32", DType::kF32, {3, 7});
  auto bf16 = set.AddZeros("bf16", DType::kBF16, {5});
  auto f16 = set.AddZeros("f16", DType::kF16, {2, 3});
  auto f64 = set.AddZeros("f64", DType::kF64, {3});
  auto ints = set.AddZeros("i32", DType::kI32, {4});
  EXPECT_TRUE(f32.ok() && bf16.ok() && f16.ok() && f64.ok() && ints.ok());
  for (size_t i = 0; i < set[0].as<float>().size(); ++i) set[0].as<float>()[i] = 0.5f * i - 3;
  for (uint16_t& v : set[1].as<uint16_t>()) v = FloatToBf16(-1.25f);
  for (uint16_t& v : set[2].as<uint16_t>()) v = FloatToF16(65504.0f);  // f16's largest finite value
  for (double& v : set[3].as<double>()) v = 1e300;
  for (int32_t& v : set[4].as<int32_t>()) v = -1;  // all bits set: an F32 NaN's pattern, not checked as I32
  set.metadata()["format"] = "pt";
  return set;
}

Status CheckInChunks(std::span<const std::byte> image, size_t chunk, SafetensorsLimits limits = {}) {
  SafetensorsStreamChecker checker(limits);
  for (size_t at = 0; at < image.size(); at += chunk)
    checker.Update(image.subspan(at, std::min(chunk, image.size() - at)));
  EXPECT_EQ(checker.bytes_seen(), image.size());
  return checker.Finish();
}

TEST(SafetensorsStreamCheckTest, ValidImageInChunksOfEverySize) {
  const std::vector<std::byte> image = SerializeSafetensors(MixedSet());
  for (size_t chunk = 1; chunk <= image.size(); ++chunk) {
    ASSERT_TRUE(CheckInChunks(image, chunk).ok())
        << "chunk " << chunk << ": " << CheckInChunks(image, chunk).ToString();
  }
  SafetensorsStreamChecker checker;
  checker.Update(image);
  ASSERT_NE(checker.layout(), nullptr);
  EXPECT_EQ(checker.layout()->tensors.size(), 5u);
}

// The largest |value| over the float tensors, whichever tensor and sign it has and however the bytes are split: the
// magnitude bound the aggregation would otherwise take in a pass of its own (WeightedMean::AcceptOwned).
TEST(SafetensorsStreamCheckTest, MaxMagnitudeOfTheValuesSeenInChunksOfEverySize) {
  const std::vector<std::byte> mixed = SerializeSafetensors(MixedSet());
  WeightSet no_f64;
  ASSERT_TRUE(no_f64.AddZeros("f32", DType::kF32, {9}).ok());
  ASSERT_TRUE(no_f64.AddZeros("bf16", DType::kBF16, {4}).ok());
  ASSERT_TRUE(no_f64.AddZeros("f16", DType::kF16, {3}).ok());
  for (size_t i = 0; i < 9; ++i) no_f64[0].as<float>()[i] = 0.25f * static_cast<float>(i) - 1.0f;  // up to 1.0
  no_f64[1].as<uint16_t>()[2] = FloatToBf16(-3.5f);  // the largest, negative, inside the middle tensor
  no_f64[2].as<uint16_t>()[0] = FloatToF16(2.0f);
  const std::vector<std::byte> floats_only = SerializeSafetensors(no_f64);
  struct Case {
    const std::vector<std::byte>* image;
    double expected;
  };
  for (const Case& c : {Case{&mixed, 1e300}, Case{&floats_only, 3.5}}) {
    for (size_t chunk = 1; chunk <= c.image->size(); ++chunk) {
      SafetensorsStreamChecker checker;
      for (size_t at = 0; at < c.image->size(); at += chunk)
        checker.Update(std::span<const std::byte>(*c.image).subspan(at, std::min(chunk, c.image->size() - at)));
      ASSERT_TRUE(checker.Finish().ok());
      ASSERT_EQ(checker.max_magnitude(), c.expected) << "chunk " << chunk;
    }
  }
}

// A NaN or Inf in the last element of each float tensor is found whatever the chunking, with CheckFinite's words.
TEST(SafetensorsStreamCheckTest, NonFiniteInTheLastByteOfATensorInChunksOfEverySize) {
  struct Case {
    size_t slot;
    std::string expected;
  };
  const Case cases[] = {
      {0, "tensor 'f32' has a non-finite value (nan) at index 20"},
      {1, "tensor 'bf16' has a non-finite value (-inf) at index 4"},
      {2, "tensor 'f16' has a non-finite value (inf) at index 5"},
      {3, "tensor 'f64' has a non-finite value (nan) at index 2"},
  };
  for (const Case& c : cases) {
    WeightSet set = MixedSet();
    const Tensor& t = set[c.slot];
    switch (t.dtype) {
      case DType::kF32: t.as<float>().back() = std::numeric_limits<float>::quiet_NaN(); break;
      case DType::kBF16: t.as<uint16_t>().back() = FloatToBf16(-std::numeric_limits<float>::infinity()); break;
      case DType::kF16: t.as<uint16_t>().back() = 0x7c00; break;
      case DType::kF64: t.as<double>().back() = std::numeric_limits<double>::quiet_NaN(); break;
      default: FAIL();
    }
    // The reference: CheckFinite on the whole set says the same.
    ASSERT_EQ(CheckFinite(set).message(), c.expected);
    const std::vector<std::byte> image = SerializeSafetensors(set);
    for (size_t chunk = 1; chunk <= image.size(); ++chunk) {
      Status verdict = CheckInChunks(image, chunk);
      ASSERT_EQ(verdict.code(), StatusCode::kInvalidArgument) << "chunk " << chunk;
      ASSERT_EQ(verdict.message(), c.expected) << "chunk " << chunk;
    }
  }
}

// Tensors longer than the scanner's blocks: the first bad value is named, wherever blocks and chunks fall.
TEST(SafetensorsStreamCheckTest, LargeTensorsNameTheFirstBadValue) {
  for (size_t bad : {size_t{0}, size_t{4095}, size_t{4096}, size_t{12'345}, size_t{19'999}}) {
    WeightSet set;
    auto bytes = set.AddZeros("big", DType::kF32, {20'000});
    ASSERT_TRUE(bytes.ok());
    set[0].as<float>()[bad] = -std::numeric_limits<float>::infinity();
    set[0].as<float>()[19'999 - (bad == 19'999 ? 1 : 0)] = 1.0f;
    if (bad < 19'000) set[0].as<float>()[19'000] = std::numeric_limits<float>::quiet_NaN();  // a later one
    const std::vector<std::byte> image = SerializeSafetensors(set);
    for (size_t chunk : {size_t{5}, size_t{4099}, size_t{65'536}, image.size()}) {
      EXPECT_EQ(CheckInChunks(image, chunk).message(),
                "tensor 'big' has a non-finite value (-inf) at index " + std::to_string(bad))
          << "chunk " << chunk;
    }
  }
}

TEST(SafetensorsStreamCheckTest, TruncatedImagesAreRejected) {
  const std::vector<std::byte> image = SerializeSafetensors(MixedSet());
  const uint64_t header_end = 8 + (SafetensorsHeaderBytes(MixedSet()).size() - 8);
  for (size_t cut = 0; cut < image.size(); ++cut) {
    Status verdict = CheckInChunks(std::span(image).first(cut), 7);
    ASSERT_EQ(verdict.code(), StatusCode::kDataLoss) << "cut at " << cut << ": " << verdict.ToString();
    if (cut < header_end) {
      EXPECT_NE(verdict.message().find("before the header does"), std::string::npos) << verdict.ToString();
    } else {
      EXPECT_NE(verdict.message().find("inside tensor"), std::string::npos) << verdict.ToString();
    }
  }
}

TEST(SafetensorsStreamCheckTest, TrailingBytesAreRejected) {
  std::vector<std::byte> image = SerializeSafetensors(MixedSet());
  image.push_back(std::byte{0});
  image.push_back(std::byte{0});
  Status verdict = CheckInChunks(image, 3);
  EXPECT_EQ(verdict.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(verdict.message().find("2 trailing bytes after the last tensor"), std::string::npos) << verdict.ToString();
}

// A length prefix over the cap is refused from the prefix alone: nothing of the header is buffered.
TEST(SafetensorsStreamCheckTest, HeaderLongerThanItsBoundIsRefusedFromThePrefix) {
  const std::vector<std::byte> image = SerializeSafetensors(MixedSet());
  const uint64_t header_bytes = SafetensorsHeaderBytes(MixedSet()).size() - 8;
  const SafetensorsLimits limits{.max_header_bytes = header_bytes - 1};
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{8}, image.size()}) {
    Status verdict = CheckInChunks(image, chunk, limits);
    EXPECT_EQ(verdict.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(verdict.message().find("exceeds the cap of " + std::to_string(header_bytes - 1)), std::string::npos)
        << verdict.ToString();
  }
  // A hostile prefix claiming 2^60 bytes of header: refused after 8 bytes, however much follows.
  std::vector<std::byte> hostile(64, std::byte{0});
  hostile[7] = std::byte{0x10};
  SafetensorsStreamChecker checker;
  checker.Update(hostile);
  EXPECT_EQ(checker.Finish().code(), StatusCode::kInvalidArgument);
}

// Every chunk boundary that falls inside the header (and the prefix), with a malformed header: the reader's verdict.
TEST(SafetensorsStreamCheckTest, ChunkBoundaryInsideTheHeader) {
  const std::vector<std::byte> image = SerializeSafetensors(MixedSet());
  const size_t header_end = SafetensorsHeaderBytes(MixedSet()).size();
  for (size_t split = 1; split < header_end; ++split) {
    SafetensorsStreamChecker checker;
    checker.Update(std::span(image).first(split));
    EXPECT_EQ(checker.layout(), nullptr);
    checker.Update(std::span(image).subspan(split));
    ASSERT_TRUE(checker.Finish().ok()) << "split at " << split << ": " << checker.Finish().ToString();
    ASSERT_NE(checker.layout(), nullptr);
  }
  // The same header with one tensor's dtype misspelt: the reader's message, whatever the split.
  std::vector<std::byte> broken = image;
  const std::string header(reinterpret_cast<const char*>(broken.data()), header_end);
  const size_t at = header.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  broken[at + 1] = std::byte{'X'};
  for (size_t split = 1; split < header_end; split += 5) {
    SafetensorsStreamChecker checker;
    checker.Update(std::span(broken).first(split));
    checker.Update(std::span(broken).subspan(split));
    EXPECT_EQ(checker.Finish().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(checker.Finish().message().find("tensor 'f32'"), std::string::npos) << checker.Finish().ToString();
  }
}

TEST(SafetensorsStreamCheckTest, EmptySetAndZeroSizedTensors) {
  WeightSet empty;
  EXPECT_TRUE(CheckInChunks(SerializeSafetensors(empty), 1).ok());
  WeightSet zeros;
  ASSERT_TRUE(zeros.AddZeros("none", DType::kF16, {0, 4}).ok());
  ASSERT_TRUE(zeros.AddZeros("one", DType::kF32, {1}).ok());
  zeros[1].as<float>()[0] = std::numeric_limits<float>::infinity();
  Status verdict = CheckInChunks(SerializeSafetensors(zeros), 2);
  EXPECT_EQ(verdict.message(), "tensor 'one' has a non-finite value (inf) at index 0");
}

}  // namespace
}  // namespace parsyn::weights
