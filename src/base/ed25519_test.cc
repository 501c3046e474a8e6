#include "base/ed25519.h"

#include <gtest/gtest.h>

#include "base/clock.h"

namespace parsyn {
namespace {

template <typename T>
T ValueOrFail(StatusOr<T> s) {
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

TEST(Ed25519Test, ASignatureVerifiesWithThePublicHalfOnlyForItsMessage) {
  Ed25519PrivateKey key = ValueOrFail(Ed25519PrivateKey::Generate());
  const std::string signature = key.Sign("chain head 7");
  ASSERT_EQ(signature.size(), 64u);
  Ed25519PublicKey pub = ValueOrFail(Ed25519PublicKey::FromPem(key.PublicPem()));
  EXPECT_TRUE(pub.Verify("chain head 7", signature));
  EXPECT_FALSE(pub.Verify("chain head 8", signature));
  std::string flipped = signature;
  flipped[10] ^= 1;
  EXPECT_FALSE(pub.Verify("chain head 7", flipped));
  EXPECT_FALSE(pub.Verify("chain head 7", signature.substr(0, 63)));

  Ed25519PublicKey other =
      ValueOrFail(Ed25519PublicKey::FromPem(ValueOrFail(Ed25519PrivateKey::Generate()).PublicPem()));
  EXPECT_FALSE(other.Verify("chain head 7", signature));
  EXPECT_NE(Ed25519KeyId(other), Ed25519KeyId(pub));
  EXPECT_EQ(Ed25519KeyId(pub).size(), 16u);
  EXPECT_EQ(pub.RawHex().size(), 64u);
}

TEST(Ed25519Test, APrivateKeyRoundTripsThroughPem) {
  Ed25519PrivateKey key = ValueOrFail(Ed25519PrivateKey::Generate());
  Ed25519PrivateKey again = ValueOrFail(Ed25519PrivateKey::FromPem(key.PrivatePem()));
  EXPECT_EQ(again.PublicPem(), key.PublicPem());
  Ed25519PublicKey pub = ValueOrFail(Ed25519PublicKey::FromPem(key.PublicPem()));
  EXPECT_TRUE(pub.Verify("m", again.Sign("m")));
}

TEST(Ed25519Test, OtherPemIsRefusedSayingWhy) {
  EXPECT_EQ(Ed25519PublicKey::FromPem("not a key").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Ed25519PrivateKey::FromPem("").status().code(), StatusCode::kInvalidArgument);
  // A private key's PEM is no public key.
  Ed25519PrivateKey key = ValueOrFail(Ed25519PrivateKey::Generate());
  EXPECT_EQ(Ed25519PublicKey::FromPem(key.PrivatePem()).status().code(), StatusCode::kInvalidArgument);
}

TEST(Rfc3339MillisTest, FormatsUtcWithMilliseconds) {
  EXPECT_EQ(Rfc3339Millis(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(Rfc3339Millis(1'764'954'191'123), "2025-12-05T17:03:11.123Z");
}

}  // namespace
}  // namespace parsyn
