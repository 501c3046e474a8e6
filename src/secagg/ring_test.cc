#include "secagg/ring.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace parsyn::secagg {
namespace {

TEST(RingTest, RingBitsIsTheSmallestWidthThatHoldsTheSum) {
  EXPECT_EQ(*RingBits(8, 1), 16);
  EXPECT_EQ(*RingBits(8, 257), 16);  // 257 * 255 = 65535
  EXPECT_EQ(*RingBits(8, 258), 32);
  EXPECT_EQ(*RingBits(16, 1), 16);
  EXPECT_EQ(*RingBits(16, 2), 32);
  EXPECT_EQ(*RingBits(16, 65537), 32);
  EXPECT_EQ(RingBits(16, 65538).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RingBits(12, 3).status().code(), StatusCode::kInvalidArgument);
}

TEST(RingTest, AMaskAndItsNegationCancelAndPiecesAreThePiecesOfTheWhole) {
  for (int bits : {16, 32}) {
    std::mt19937 rng(static_cast<unsigned>(bits));
    std::vector<uint32_t> values(70000);
    for (uint32_t& v : values) v = rng() & RingMask(bits);
    const Key32 seed = *RandomKey();
    std::vector<uint32_t> masked = values;
    ApplyMask(seed, 1, bits, 0, masked);
    EXPECT_NE(masked, values);
    size_t unchanged = 0;
    for (size_t i = 0; i < values.size(); ++i) unchanged += masked[i] == values[i];
    EXPECT_LT(unchanged, 10u);
    for (uint32_t v : masked) ASSERT_LE(v, RingMask(bits));
    // Taking the mask off piece by piece, at offsets that do not fall on keystream blocks, gives the values back.
    for (size_t begin = 0; begin < masked.size(); begin += 12345) {
      const size_t count = std::min<size_t>(12345, masked.size() - begin);
      ApplyMask(seed, -1, bits, begin, std::span<uint32_t>(masked).subspan(begin, count));
    }
    EXPECT_EQ(masked, values);
  }
}

TEST(RingTest, TheMaskIsTheAes256CtrKeystreamOfTheSeed) {
  // AES-256 of the zero block under the zero key (FIPS-197 style known answer): dc95c078 a2408989 ad48a214 92842087.
  std::vector<uint32_t> words(4, 0);
  ApplyMask(Key32{}, 1, 32, 0, words);
  EXPECT_EQ(words, (std::vector<uint32_t>{0x78c095dc, 0x898940a2, 0x14a248ad, 0x87208492}));
  std::vector<uint32_t> halves(2, 0);
  ApplyMask(Key32{}, 1, 16, 0, halves);
  EXPECT_EQ(halves, (std::vector<uint32_t>{0x95dc, 0x78c0}));
}

TEST(RingTest, ApplyMasksIsEachMaskInTurn) {
  std::vector<uint32_t> values(3 << 20, 7), one_by_one = values;  // three threads' ranges
  const std::vector<SignedSeed> masks = {{*RandomKey(), 1}, {*RandomKey(), -1}, {*RandomKey(), 1}};
  ApplyMasks(masks, 32, values);
  for (const SignedSeed& mask : masks) ApplyMask(mask.seed, mask.sign, 32, 0, one_by_one);
  EXPECT_EQ(values, one_by_one);
}

TEST(RingTest, APackedVectorAddsAsItsUnpackedValuesWould) {
  for (int bits : {16, 32}) {
    std::mt19937 rng(static_cast<unsigned>(bits) + 1);
    std::vector<uint32_t> sum(600000), other(600000);  // three ranges of threads
    for (uint32_t& v : sum) v = rng() & RingMask(bits);
    for (uint32_t& v : other) v = rng() & RingMask(bits);
    std::vector<uint32_t> expected = sum;
    AddInto(expected, other, bits);
    ASSERT_TRUE(AddPacked(sum, PackRing(other, bits), bits).ok());
    EXPECT_EQ(sum, expected);
    const std::vector<uint32_t> before = sum;
    EXPECT_EQ(AddPacked(sum, PackRing(other, bits).substr(1), bits).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(sum, before);  // nothing added
  }
}

TEST(RingTest, PackedVectorsTakeTheirWidthAndComeBack) {
  const std::vector<uint32_t> values = {0, 1, 0xffff, 0x1234};
  EXPECT_EQ(PackRing(values, 16).size(), 8u);
  EXPECT_EQ(*UnpackRing(PackRing(values, 16), 16, 4), values);
  const std::vector<uint32_t> wide = {0xffffffff, 0x80000001};
  EXPECT_EQ(PackRing(wide, 32), std::string("\xff\xff\xff\xff\x01\x00\x00\x80", 8));
  EXPECT_EQ(*UnpackRing(PackRing(wide, 32), 32, 2), wide);
  EXPECT_EQ(UnpackRing("abc", 16, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(UnpackRing("abcd", 16, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::secagg
