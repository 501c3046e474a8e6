#include "secagg/crypto.h"

#include <gtest/gtest.h>

#include "base/strings.h"

namespace parsyn::secagg {
namespace {

Key32 FromHex(std::string_view hex) { return *weights::ParseSecretKey(hex); }

std::string Hex(const Key32& key) { return HexEncode(std::span<const unsigned char>(key.data(), key.size())); }

// RFC 7748, section 6.1.
constexpr std::string_view kAlicePrivate = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
constexpr std::string_view kAlicePublic = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
constexpr std::string_view kBobPrivate = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb";
constexpr std::string_view kBobPublic = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";

TEST(CryptoTest, X25519MatchesRfc7748AndBothSidesAgree) {
  EXPECT_EQ(Hex(*X25519PublicKey(FromHex(kAlicePrivate))), kAlicePublic);
  EXPECT_EQ(Hex(*X25519PublicKey(FromHex(kBobPrivate))), kBobPublic);
  const Key32 a = *AgreeKey(FromHex(kAlicePrivate), FromHex(kBobPublic), "use");
  const Key32 b = *AgreeKey(FromHex(kBobPrivate), FromHex(kAlicePublic), "use");
  EXPECT_EQ(a, b);
  // The agreed key is HKDF-SHA256 of RFC 7748's shared secret.
  const auto shared = *HexDecode("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  EXPECT_EQ(a, DeriveKey(shared, "use"));
  EXPECT_NE(a, *AgreeKey(FromHex(kAlicePrivate), FromHex(kBobPublic), "other use"));
}

TEST(CryptoTest, HkdfMatchesRfc5869) {
  // Test case 3: no salt, no info; the first 32 bytes of its output.
  EXPECT_EQ(Hex(DeriveKey(std::string(22, '\x0b'), "")),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d");
}

TEST(CryptoTest, KeysOfSmallOrderAreRefused) {
  const X25519KeyPair pair = *GenerateX25519KeyPair();
  EXPECT_EQ(AgreeKey(pair.private_key, Key32{}, "use").status().code(), StatusCode::kInvalidArgument);
  Key32 one{};
  one[0] = 1;
  EXPECT_EQ(AgreeKey(pair.private_key, one, "use").status().code(), StatusCode::kInvalidArgument);
}

TEST(CryptoTest, FreshKeyPairsAreDistinctAndConsistent) {
  const X25519KeyPair a = *GenerateX25519KeyPair(), b = *GenerateX25519KeyPair();
  EXPECT_NE(a.private_key, b.private_key);
  EXPECT_EQ(*X25519PublicKey(a.private_key), a.public_key);
  EXPECT_NE(*RandomKey(), *RandomKey());
}

TEST(CryptoTest, SealedTextOpensOnlyUnderItsKeyAndAssociatedData) {
  const Key32 key = *RandomKey();
  const std::string sealed = *Seal(key, "from 1 to 2", "the share");
  EXPECT_EQ(sealed.size(), 12 + 9 + 16u);
  EXPECT_NE(sealed, *Seal(key, "from 1 to 2", "the share"));  // a fresh nonce each time
  EXPECT_EQ(*Open(key, "from 1 to 2", sealed), "the share");
  EXPECT_EQ(Open(key, "from 2 to 1", sealed).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Open(*RandomKey(), "from 1 to 2", sealed).status().code(), StatusCode::kPermissionDenied);
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string altered = sealed;
    altered[i] = static_cast<char>(altered[i] ^ 0x01);
    EXPECT_EQ(Open(key, "from 1 to 2", altered).status().code(), StatusCode::kPermissionDenied) << "byte " << i;
  }
  EXPECT_EQ(Open(key, "from 1 to 2", sealed.substr(0, 27)).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Open(key, "", "").status().code(), StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace parsyn::secagg
