#include "secagg/messages.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace parsyn::secagg {
namespace {

using nlohmann::json;

TEST(SecAggMessagesTest, EachMessageComesBackFromItsJson) {
  const RoundSetup setup = *MakeRoundSetup("job 4 round 2 attempt 3", {3, 9, 4, 12}, 3, 3, 8, 2.5, 101, *RandomKey());
  EXPECT_EQ(*ParseRoundSetup(ToJson(setup)), setup);
  const AdvertisedKeys keys{9,
                            *RandomKey(),
                            *RandomKey(),
                            *RandomKey(),
                            std::string("\x01\x00\xff", 3),
                            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"};
  EXPECT_EQ(*ParseAdvertisedKeys(json::parse(ToJson(keys).dump())), keys);
  const SealedShare share{9, 4, std::string(60, '\x7f')};
  EXPECT_EQ(*ParseSealedShare(ToJson(share)), share);
  const RevealedShare revealed{9, SecretKind::kMaskingKey, {2, {1, 2, 3, 4, kShamirPrime - 1}}};
  EXPECT_EQ(*ParseRevealedShare(ToJson(revealed)), revealed);
  const DistributedNoise noise{.clip_norm = 0.5, .noise_stddev = 0.125};
  EXPECT_EQ(*ParseDistributedNoise(json::parse(ToJson(noise).dump())), noise);
}

TEST(SecAggMessagesTest, MalformedMessagesAreRefusedNamingTheField) {
  json keys = ToJson(AdvertisedKeys{9, *RandomKey(), *RandomKey(), *RandomKey(), ""});
  keys["masking_key"] = "zz";
  Status status = ParseAdvertisedKeys(keys).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'masking_key'"), std::string::npos) << status.ToString();
  keys.erase("masking_key");
  keys["extra"] = 1;
  status = ParseAdvertisedKeys(keys).status();
  EXPECT_NE(status.message().find("unknown field 'extra'"), std::string::npos) << status.ToString();
  EXPECT_EQ(ParseSealedShare(json::array()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSealedShare(json{{"from", 1}, {"to", 2}, {"sealed", "abc"}}).status().code(),
            StatusCode::kInvalidArgument);
  json revealed = ToJson(RevealedShare{9, SecretKind::kSeed, {2, {1, 2}}});
  revealed["y"] = json::array({kShamirPrime});
  EXPECT_EQ(ParseRevealedShare(revealed).status().code(), StatusCode::kInvalidArgument);
  revealed["y"] = json::array({1});
  revealed["kind"] = "both";
  EXPECT_EQ(ParseRevealedShare(revealed).status().code(), StatusCode::kInvalidArgument);
  json setup = ToJson(*MakeRoundSetup("a", {1, 2, 3}, 2, 2, 16, 8.0, 5, Key32{}));
  setup["share_threshold"] = 1;  // lowered by the coordinator
  EXPECT_EQ(ParseRoundSetup(setup).status().code(), StatusCode::kInvalidArgument);
  setup.erase("share_threshold");
  status = ParseRoundSetup(setup).status();
  EXPECT_NE(status.message().find("secure_aggregation.share_threshold"), std::string::npos) << status.ToString();
  status = ParseDistributedNoise(json{{"clip_norm", 0.0}, {"noise_stddev", 1.0}}).status();
  EXPECT_NE(status.message().find("clip_norm"), std::string::npos) << status.ToString();
  status = ParseDistributedNoise(json{{"clip_norm", 1.0}, {"noise_stddev", -1.0}}).status();
  EXPECT_NE(status.message().find("noise_stddev"), std::string::npos) << status.ToString();
  EXPECT_EQ(ParseDistributedNoise(json{{"clip_norm", 1.0}}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SecAggMessagesTest, TheSignedBytesBindTheAttemptAndEveryKey) {
  const AdvertisedKeys keys{9, *RandomKey(), *RandomKey(), *RandomKey(), ""};
  const std::string bytes = SignedBytes("attempt 1", keys);
  EXPECT_NE(bytes, SignedBytes("attempt 2", keys));
  for (int field = 0; field < 4; ++field) {
    AdvertisedKeys other = keys;
    if (field == 0) other.worker = 10;
    if (field == 1) other.sealing_key[0] ^= 1;
    if (field == 2) other.masking_key[5] ^= 1;
    if (field == 3) other.seed_commitment[31] ^= 1;
    EXPECT_NE(bytes, SignedBytes("attempt 1", other)) << field;
  }
}

}  // namespace
}  // namespace parsyn::secagg
