#include "worker/global_downlink.h"

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "base/sha256.h"
#include "base/testing/temp_dir.h"
#include "weights/safetensors.h"
#include "weights/update_wire.h"

namespace parsyn::worker {
namespace {

namespace fs = std::filesystem;

weights::WeightSet RandomSet(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(512);
  for (float& v : values) v = normal(rng);
  weights::WeightSet set;
  EXPECT_TRUE(set.Add("layer.weight", weights::DType::kF32, {8, 64}, std::as_bytes(std::span(values))).ok());
  return set;
}

// A delta as the coordinator writes it (in dir/delta), the task's description of it, and the sha256 of the global it
// stands for (written as the coordinator writes it).
struct Offer {
  protocol::TaskGlobalDelta delta;
  std::string global_sha256;
};
// Job `job_id`'s held global (a random base, written in `dir`), and the offer of a new global as its delta.
Offer HoldBaseAndOffer(const fs::path& dir, const fs::path& state, int64_t job_id) {
  const weights::WeightSet base = RandomSet(1);
  EXPECT_TRUE(weights::WriteSafetensorsFile(base, dir / "base").ok());
  EXPECT_TRUE(HoldGlobal(state, job_id, dir / "base", Sha256File(dir / "base").value()).ok());
  const weights::WireEncoding encoding{.codec = weights::UpdateCodec::kInt8, .delta = true, .error_feedback = true};
  EXPECT_TRUE(weights::EncodeSetForWire(RandomSet(2), base, encoding, dir / "residual", dir / "delta").ok());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  EXPECT_TRUE(weights::WriteGlobalFromDelta(dir / "delta", base, encoding, metadata, dir / "coordinator.st").ok());
  Offer offer;
  offer.delta = {.codec = "int8", .metadata = {{"format", "pt"}}};
  offer.global_sha256 = Sha256File(dir / "coordinator.st").value();
  return offer;
}

TEST(GlobalDownlinkTest, AHeldGlobalIsNamedByItsSha256AndReplacedByTheNext) {
  test_support::TempDir dir("global-downlink-test");
  const fs::path state = dir.path() / "state";
  EXPECT_EQ(HeldGlobalSha256(state, 4), "");
  ASSERT_TRUE(weights::WriteSafetensorsFile(RandomSet(1), dir.path() / "g1").ok());
  ASSERT_TRUE(HoldGlobal(state, 4, dir.path() / "g1", std::string(64, 'a')).ok());
  EXPECT_EQ(HeldGlobalSha256(state, 4), std::string(64, 'a'));
  EXPECT_EQ(HeldGlobalSha256(state, 5), "");
  ASSERT_TRUE(weights::WriteSafetensorsFile(RandomSet(2), dir.path() / "g2").ok());
  ASSERT_TRUE(HoldGlobal(state, 4, dir.path() / "g2", std::string(64, 'b')).ok());
  EXPECT_EQ(HeldGlobalSha256(state, 4), std::string(64, 'b'));
  // The task folder's file may go: the held one is a link of its own.
  fs::remove(dir.path() / "g2");
  EXPECT_EQ(HeldGlobalSha256(state, 4), std::string(64, 'b'));
  // A retried round's task names the held global: it is used as it is.
  ASSERT_TRUE(UseHeldGlobal(state, 4, dir.path() / "task-global").ok());
  EXPECT_EQ(Sha256File(dir.path() / "task-global").value(), Sha256File(state / "job-4-global.safetensors").value());
}

TEST(GlobalDownlinkTest, TheGlobalRebuiltFromItsDeltaIsTheCoordinatorsByteForByte) {
  test_support::TempDir dir("global-downlink-test");
  const fs::path state = dir.path() / "state";
  const Offer offer = HoldBaseAndOffer(dir.path(), state, 9);
  const fs::path out = dir.path() / "global.safetensors";
  ASSERT_TRUE(GlobalFromDelta(offer.delta, offer.global_sha256, state, 9, dir.path() / "delta", out).ok());
  EXPECT_EQ(Sha256File(out).value(), offer.global_sha256);
}

// Bad input: a delta that rebuilds other bytes (here: other metadata than the task names) is DataLoss naming both
// sha256s, a delta that does not decode is InvalidArgument; nothing is left at the output either way.
TEST(GlobalDownlinkTest, ADeltaThatRebuildsOtherBytesOrDoesNotDecodeFailsAndLeavesNothing) {
  test_support::TempDir dir("global-downlink-test");
  const fs::path state = dir.path() / "state";
  const Offer offer = HoldBaseAndOffer(dir.path(), state, 9);
  const fs::path out = dir.path() / "global.safetensors";

  protocol::TaskGlobalDelta other_metadata = offer.delta;
  other_metadata.metadata = {{"format", "np"}};
  Status wrong = GlobalFromDelta(other_metadata, offer.global_sha256, state, 9, dir.path() / "delta", out);
  EXPECT_EQ(wrong.code(), StatusCode::kDataLoss);
  EXPECT_NE(wrong.message().find("the task says " + offer.global_sha256), std::string::npos) << wrong.message();
  EXPECT_FALSE(fs::exists(out));

  fs::resize_file(dir.path() / "delta", fs::file_size(dir.path() / "delta") / 2);
  Status truncated = GlobalFromDelta(offer.delta, offer.global_sha256, state, 9, dir.path() / "delta", out);
  EXPECT_EQ(truncated.code(), StatusCode::kInvalidArgument) << truncated.ToString();
  EXPECT_FALSE(fs::exists(out));
}

TEST(GlobalDownlinkTest, ForgettingAJobRemovesItsFilesOnly) {
  test_support::TempDir dir("global-downlink-test");
  const fs::path state = dir.path() / "state";
  ASSERT_TRUE(weights::WriteSafetensorsFile(RandomSet(1), dir.path() / "g").ok());
  ASSERT_TRUE(HoldGlobal(state, 1, dir.path() / "g", std::string(64, 'a')).ok());
  ASSERT_TRUE(HoldGlobal(state, 12, dir.path() / "g", std::string(64, 'b')).ok());
  std::ofstream(state / "job-1-residual.safetensors") << "r";
  ForgetJob(state, 1);
  EXPECT_EQ(HeldGlobalSha256(state, 1), "");
  EXPECT_FALSE(fs::exists(state / "job-1-residual.safetensors"));
  EXPECT_EQ(HeldGlobalSha256(state, 12), std::string(64, 'b'));  // job 12's files ("job-1" is a prefix) stay
}

}  // namespace
}  // namespace parsyn::worker
