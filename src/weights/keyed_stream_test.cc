#include "weights/keyed_stream.h"

#include <gtest/gtest.h>

namespace parsyn::weights {
namespace {

// RFC 8439, appendix A.1, test vector 1: the all-zero key and nonce, block 0, whose keystream begins
// 76 b8 e0 ad a0 f1 3d 90 40 5d 6a e5 53 86 bd 28.
TEST(KeyedStreamTest, IsChaCha20sKeystream) {
  KeyedStream stream(SecretKey{}, 0, 0);
  EXPECT_EQ(stream.Next(), 0x903df1a0ade0b876ULL);
  EXPECT_EQ(stream.Next(), 0x28bd8653e56a5d40ULL);
}

TEST(KeyedStreamTest, SameKeyAndNonceRepeatOthersDiffer) {
  const SecretKey key = *ParseSecretKey(std::string(62, 'a') + "01");
  KeyedStream a(key, 1, 7), b(key, 1, 7), other_round(key, 1, 8), other_domain(key, 2, 7);
  for (int i = 0; i < 2000; ++i) {  // across a refill
    const uint64_t w = a.Next();
    EXPECT_EQ(w, b.Next());
    EXPECT_NE(w, other_round.Next());
    EXPECT_NE(w, other_domain.Next());
  }
  SecretKey another = key;
  another[31] ^= 1;
  EXPECT_NE(KeyedStream(key, 1, 7).Next(), KeyedStream(another, 1, 7).Next());
}

TEST(KeyedStreamTest, RanksDependOnEveryInput) {
  const SecretKey key = *ParseSecretKey(std::string(64, 'F'));
  const uint64_t r = KeyedRank(key, 1, 2, 3);
  EXPECT_EQ(r, KeyedRank(key, 1, 2, 3));
  EXPECT_NE(r, KeyedRank(key, 1, 2, 4));
  EXPECT_NE(r, KeyedRank(key, 1, 3, 3));
  EXPECT_NE(r, KeyedRank(key, 2, 2, 3));
}

TEST(KeyedStreamTest, KeysAreSixtyFourHexDigits) {
  EXPECT_EQ(ParseSecretKey("abc").status().message(), "a secret key is 64 hex digits");
  EXPECT_FALSE(ParseSecretKey(std::string(63, '0') + "g").ok());
  EXPECT_EQ((*ParseSecretKey("0f" + std::string(62, '0')))[0], 0x0f);
}

}  // namespace
}  // namespace parsyn::weights
