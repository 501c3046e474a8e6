#include "weights/weight_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace parsyn::weights {
namespace {

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

TEST(DTypeTest, NamesSizesAndParsingRoundTrip) {
  struct Row {
    DType dtype;
    const char* name;
    size_t size;
    bool is_float;
  };
  const Row rows[] = {
      {DType::kF32, "F32", 4, true},    {DType::kF16, "F16", 2, true},  {DType::kBF16, "BF16", 2, true},
      {DType::kF64, "F64", 8, true},    {DType::kI64, "I64", 8, false}, {DType::kI32, "I32", 4, false},
      {DType::kI16, "I16", 2, false},   {DType::kI8, "I8", 1, false},   {DType::kU8, "U8", 1, false},
      {DType::kBool, "BOOL", 1, false},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(DTypeName(row.dtype), row.name);
    EXPECT_EQ(DTypeSize(row.dtype), row.size) << row.name;
    EXPECT_EQ(IsFloat(row.dtype), row.is_float) << row.name;
    auto parsed = ParseDType(row.name);
    ASSERT_TRUE(parsed.ok()) << row.name;
    EXPECT_EQ(*parsed, row.dtype);
  }
  auto bad = ParseDType("F8_E4M3");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "unknown dtype 'F8_E4M3'");
}

TEST(ShapeTest, NumElementsRejectsNegativeAndOverflow) {
  EXPECT_EQ(*NumElements(std::vector<int64_t>{}), 1);
  EXPECT_EQ(*NumElements(std::vector<int64_t>{2, 3, 4}), 24);
  EXPECT_EQ(*NumElements(std::vector<int64_t>{2, 0, 4}), 0);
  auto negative = NumElements(std::vector<int64_t>{2, -1});
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("negative"), std::string::npos);
  auto overflow = NumElements(std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(overflow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.status().message().find("overflows"), std::string::npos);
  EXPECT_EQ(ShapeString(std::vector<int64_t>{8, 4096}), "[8, 4096]");
  EXPECT_EQ(ShapeString(std::vector<int64_t>{}), "[]");
}

TEST(WeightSetTest, AddFindAndOrder) {
  WeightSet set;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, 8};
  ASSERT_TRUE(set.Add("a", DType::kF32, {2, 3}, Bytes(a)).ok());
  ASSERT_TRUE(set.Add("b", DType::kI64, {2}, Bytes(b)).ok());
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(set[0].name, "a");
  EXPECT_EQ(set[1].name, "b");
  EXPECT_EQ(set.total_bytes(), 6 * 4 + 2 * 8u);
  const Tensor* found = set.Find("a");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->numel(), 6);
  EXPECT_EQ(found->as<float>()[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(found->data.data()) % 64, 0u);
  EXPECT_EQ(set.Find("c"), nullptr);
}

TEST(WeightSetTest, AddRejectsBadInput) {
  WeightSet set;
  std::vector<float> four(4);
  ASSERT_TRUE(set.Add("w", DType::kF32, {4}, Bytes(four)).ok());
  Status taken = set.Add("w", DType::kF32, {4}, Bytes(four));
  EXPECT_EQ(taken.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(taken.message(), "tensor 'w' already exists in the set");
  Status empty = set.Add("", DType::kF32, {4}, Bytes(four));
  EXPECT_EQ(empty.message(), "tensor name is empty");
  Status size = set.Add("x", DType::kF32, {5}, Bytes(four));
  EXPECT_EQ(size.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(size.message(), "tensor 'x' (F32, shape [5]) needs 20 bytes, got 16");
  Status shape = set.Add("y", DType::kF32, {-4}, Bytes(four));
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("tensor 'y'"), std::string::npos);
  auto zeros = set.AddZeros("z", DType::kBF16, {3, 2});
  ASSERT_TRUE(zeros.ok());
  EXPECT_EQ(zeros->size(), 12u);
  EXPECT_EQ(set.size(), 2u);
}

// Zero-filled tensors from 1 MiB up are mappings that start on a 2 MiB boundary (where transparent huge pages can
// back them); smaller ones are 64-byte aligned. Every byte is zero and writable, the last included.
TEST(WeightSetTest, AddZerosGivesZeroedAlignedBytesOfEverySize) {
  WeightSet set;
  const int64_t sizes[] = {1, 1000, (int64_t{1} << 20) / 4 - 1, (int64_t{1} << 20) / 4, (int64_t{5} << 20) / 4 + 3};
  for (int64_t numel : sizes) {
    auto bytes = set.AddZeros("t" + std::to_string(numel), DType::kF32, {numel});
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->size(), static_cast<size_t>(numel) * 4);
    const auto address = reinterpret_cast<uintptr_t>(bytes->data());
    EXPECT_EQ(address % (bytes->size() >= (size_t{1} << 20) ? size_t{2} << 20 : 64), 0u) << numel << " elements";
    EXPECT_TRUE(std::all_of(bytes->begin(), bytes->end(), [](std::byte b) { return b == std::byte{0}; }));
    bytes->back() = std::byte{1};
    bytes->front() = std::byte{1};
  }
}

TEST(WeightSetTest, AddViewKeepsBackingAliveAndChecksAlignment) {
  auto storage = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  std::span<std::byte> bytes = std::as_writable_bytes(std::span<float>(*storage));
  std::weak_ptr<std::vector<float>> watch = storage;
  {
    WeightSet set;
    ASSERT_TRUE(set.AddView("v", DType::kF32, {4}, bytes, storage).ok());
    Status misaligned = set.AddView("m", DType::kF32, {1}, bytes.subspan(1, 4), storage);
    EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument);
    storage.reset();
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(set[0].as<float>()[3], 4.0f);
  }
  EXPECT_TRUE(watch.expired());
}

TEST(WeightSetTest, CloneIsDeepAndKeepsMetadata) {
  WeightSet set;
  std::vector<float> a = {1, 2};
  ASSERT_TRUE(set.Add("a", DType::kF32, {2}, Bytes(a)).ok());
  set.metadata()["format"] = "pt";
  WeightSet copy = set.Clone();
  set[0].as<float>()[0] = 42;
  EXPECT_EQ(copy[0].as<float>()[0], 1.0f);
  EXPECT_EQ(copy.metadata().at("format"), "pt");
  EXPECT_TRUE(set.CheckSameLayout(copy).ok());
}

TEST(WeightSetTest, CheckSameLayoutNamesTheFirstDifference) {
  auto make = [](std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> specs) {
    WeightSet set;
    for (auto& [name, dtype, shape] : specs) EXPECT_TRUE(set.AddZeros(name, dtype, shape).ok());
    return set;
  };
  WeightSet want = make({{"a", DType::kF32, {16, 16}}, {"b", DType::kBF16, {4}}});
  struct Row {
    WeightSet got;
    std::string message;
  };
  std::vector<Row> rows;
  rows.push_back({make({{"a", DType::kF32, {8, 16}}, {"b", DType::kBF16, {4}}}),
                  "tensor 'a' has shape [8, 16], expected [16, 16]"});
  rows.push_back(
      {make({{"a", DType::kF32, {16, 16}}, {"b", DType::kF16, {4}}}), "tensor 'b' has dtype F16, expected BF16"});
  rows.push_back({make({{"a", DType::kF32, {16, 16}}, {"c", DType::kBF16, {4}}}), "unexpected tensor 'c'"});
  rows.push_back({make({{"a", DType::kF32, {16, 16}}}), "missing tensor 'b' (1 tensors, expected 2)"});
  rows.push_back({make({{"b", DType::kBF16, {4}}, {"a", DType::kF32, {16, 16}}}),
                  "tensor #0 is 'b', expected 'a' (tensors are in a different order)"});
  rows.push_back({make({{"a", DType::kF32, {16, 16}}, {"b", DType::kBF16, {4}}, {"x", DType::kF32, {1}}}),
                  "unexpected tensor 'x' (3 tensors, expected 2)"});
  for (const Row& row : rows) {
    Status s = want.CheckSameLayout(row.got);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << row.message;
    EXPECT_EQ(s.message(), row.message);
  }
  EXPECT_TRUE(want.CheckSameLayout(make({{"a", DType::kF32, {16, 16}}, {"b", DType::kBF16, {4}}})).ok());
}

TEST(CheckFiniteTest, FindsNanAndInfInEveryFloatDtype) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  struct Row {
    DType dtype;
    float bad;
    const char* word;
  };
  const Row rows[] = {{DType::kF32, kNan, "nan"},  {DType::kF32, -kInf, "-inf"}, {DType::kBF16, kInf, "inf"},
                      {DType::kBF16, kNan, "nan"}, {DType::kF16, kNan, "nan"},   {DType::kF16, -kInf, "-inf"},
                      {DType::kF64, kInf, "inf"}};
  for (const Row& row : rows) {
    WeightSet set;
    auto ok = set.AddZeros("ok", row.dtype, {3});
    ASSERT_TRUE(ok.ok());
    auto bytes = set.AddZeros("w", row.dtype, {5000});
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(CheckFinite(set).ok());
    const size_t index = 4100;  // past the first scan block
    std::byte* slot = bytes->data() + index * DTypeSize(row.dtype);
    switch (row.dtype) {
      case DType::kF32: std::memcpy(slot, &row.bad, 4); break;
      case DType::kF64: {
        double d = row.bad;
        std::memcpy(slot, &d, 8);
        break;
      }
      case DType::kBF16: {
        uint16_t h = FloatToBf16(row.bad);
        std::memcpy(slot, &h, 2);
        break;
      }
      default: {
        uint16_t h = FloatToF16(row.bad);
        std::memcpy(slot, &h, 2);
      }
    }
    Status s = CheckFinite(set);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), std::string("tensor 'w' has a non-finite value (") + row.word + ") at index 4100")
        << DTypeName(row.dtype);
  }
  // Integer tensors are not scanned: all-ones bytes are a valid I32.
  WeightSet ints;
  auto bytes = ints.AddZeros("i", DType::kI32, {4});
  std::memset(bytes->data(), 0xff, bytes->size());
  EXPECT_TRUE(CheckFinite(ints).ok());
}

TEST(ConversionTest, Bf16RoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::max()))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), h);
  }
}

TEST(ConversionTest, F16RoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = F16ToFloat(static_cast<uint16_t>(h));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      ASSERT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(FloatToF16(f), h) << h;
  }
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x0001), 0x1p-24f);         // smallest subnormal
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);         // max finite
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);         // halfway to the next step rounds to Inf (even)
  EXPECT_EQ(FloatToF16(1.0f + 0x1p-11f), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToF16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToF16(0x1p-25f), 0x0000);  // tie between 0 and the smallest subnormal -> 0
  EXPECT_EQ(FloatToF16(0x1p-25f + 0x1p-30f), 0x0001);
  // Against a double-precision reference: the f16 result is the nearest representable value.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 20000; ++i) {
    float f = dist(rng) * (i % 2 ? 1.0f : 1e-4f);
    uint16_t h = FloatToF16(f);
    double got = F16ToFloat(h);
    if (std::isinf(got)) {
      EXPECT_GE(std::fabs(f), 65520.0f);
      continue;
    }
    double below = F16ToFloat(static_cast<uint16_t>(h - 1 + (h == 0 || h == 0x8000 ? 1 : 0)));
    double above = F16ToFloat(static_cast<uint16_t>(h + 1));
    EXPECT_LE(std::fabs(got - f), std::fabs(below - f)) << f;
    if (!std::isinf(above)) {
      EXPECT_LE(std::fabs(got - f), std::fabs(above - f)) << f;
    }
  }
}

}  // namespace
}  // namespace parsyn::weights
