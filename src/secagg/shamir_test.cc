#include "secagg/shamir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace parsyn::secagg {
namespace {

std::vector<unsigned char> Secret(size_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> out(bytes);
  for (unsigned char& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

std::vector<uint32_t> Points(size_t n) {
  std::vector<uint32_t> out(n);
  std::iota(out.begin(), out.end(), 1);
  return out;
}

TEST(ShamirTest, AnyThresholdSharesRebuildTheSecret) {
  std::mt19937 rng(5);
  for (size_t bytes : {1u, 7u, 8u, 32u, 64u}) {
    for (size_t n : {1u, 2u, 5u, 17u}) {
      for (size_t threshold = 1; threshold <= n; threshold += (n > 5 ? 4 : 1)) {
        const std::vector<unsigned char> secret = Secret(bytes, static_cast<unsigned>(bytes * 100 + n));
        auto shares = SplitSecret(secret, threshold, Points(n));
        ASSERT_TRUE(shares.ok()) << shares.status().ToString();
        std::shuffle(shares->begin(), shares->end(), rng);
        const std::vector<ShamirShare> some(shares->begin(), shares->begin() + static_cast<std::ptrdiff_t>(threshold));
        auto rebuilt = CombineShares(some, threshold, bytes);
        ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
        EXPECT_EQ(*rebuilt, secret) << bytes << " bytes, " << threshold << " of " << n;
        auto all = CombineShares(*shares, threshold, bytes);  // the extras lie on the polynomial
        ASSERT_TRUE(all.ok()) << all.status().ToString();
        EXPECT_EQ(*all, secret);
      }
    }
  }
}

TEST(ShamirTest, OneShareBelowTheThresholdDoesNotRebuildIt) {
  const std::vector<unsigned char> secret = Secret(32, 1);
  for (size_t threshold : {2u, 3u, 7u, 12u}) {
    auto shares = SplitSecret(secret, threshold, Points(12));
    ASSERT_TRUE(shares.ok());
    const std::vector<ShamirShare> too_few(shares->begin(),
                                           shares->begin() + static_cast<std::ptrdiff_t>(threshold - 1));
    EXPECT_EQ(CombineShares(too_few, threshold, 32).status().code(), StatusCode::kFailedPrecondition);
    // Interpolating them as if they were enough gives something else: a polynomial of a lower degree through them
    // does not pass through the secret (its constant term is random).
    auto guessed = CombineShares(too_few, threshold - 1, 32);
    EXPECT_TRUE(!guessed.ok() || *guessed != secret);
  }
}

TEST(ShamirTest, SharesBelowTheThresholdSayNothingOfTheSecret) {
  // Two different secrets, shared with threshold 3: a pair of shares at the same points is uniformly spread for both.
  // Check that the first chunk of one share takes many distinct values for one fixed secret (no structure leaks).
  const std::vector<unsigned char> secret = Secret(32, 2);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 200; ++i) seen.push_back((*SplitSecret(secret, 3, Points(5)))[0].y[0]);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()) - seen.begin(), 200);
}

TEST(ShamirTest, ACorruptShareIsDetectedWhenThereAreMoreThanEnough) {
  const std::vector<unsigned char> secret = Secret(32, 3);
  auto shares = *SplitSecret(secret, 3, Points(5));
  shares[4].y[2] = (shares[4].y[2] + 1) % kShamirPrime;
  EXPECT_EQ(CombineShares(shares, 3, 32).status().code(), StatusCode::kDataLoss);
  shares[0].y[0] = (shares[0].y[0] + 1) % kShamirPrime;  // among the defining ones: the chunk is out of range or wrong
  auto rebuilt = CombineShares(std::vector<ShamirShare>(shares.begin(), shares.begin() + 3), 3, 32);
  EXPECT_TRUE(!rebuilt.ok() || *rebuilt != secret);
}

TEST(ShamirTest, BadArgumentsAreRefused) {
  const std::vector<unsigned char> secret = Secret(32, 4);
  EXPECT_EQ(SplitSecret(secret, 0, Points(3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSecret(secret, 4, Points(3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSecret(secret, 2, std::vector<uint32_t>{1, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSecret(secret, 2, std::vector<uint32_t>{3, 3}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSecret({}, 1, Points(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSecret(Secret(65, 1), 1, Points(1)).status().code(), StatusCode::kInvalidArgument);
  auto shares = *SplitSecret(secret, 2, Points(3));
  shares[1].x = shares[0].x;
  EXPECT_EQ(CombineShares(shares, 2, 32).status().code(), StatusCode::kInvalidArgument);
  shares = *SplitSecret(secret, 2, Points(3));
  shares[0].y.pop_back();
  EXPECT_EQ(CombineShares(shares, 2, 32).status().code(), StatusCode::kInvalidArgument);
  shares = *SplitSecret(secret, 2, Points(3));
  shares[0].y[0] = kShamirPrime;
  EXPECT_EQ(CombineShares(shares, 2, 32).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::secagg
