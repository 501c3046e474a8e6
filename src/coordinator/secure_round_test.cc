#include "coordinator/secure_round.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "secagg/ring.h"

namespace parsyn::coordinator {
namespace {

using secagg::Client;
using Phase = SecureRound::Phase;

constexpr Clock::Duration kPhaseTimeout{30'000};
const Clock::TimePoint kStart{Clock::Duration{1'000'000}};

// A round of workers 1..n with the default threshold and graph, and each worker's Client.
struct Fixture {
  explicit Fixture(size_t n, size_t threshold = 0) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 1; id <= n; ++id) ids.push_back(id);
    setup = *secagg::MakeRoundSetup("job 1 round 1 attempt 1", ids, threshold ? threshold : secagg::DefaultThreshold(n),
                                    secagg::DefaultNeighbors(n), 16, 1.0, 9, *secagg::RandomKey());
    round.emplace(*SecureRound::Start(setup, kStart, kPhaseTimeout, 2 * kPhaseTimeout, nullptr));
    for (uint64_t id : ids) clients.emplace(id, *Client::Start(setup, id, {}));
  }
  void Advertise(uint64_t id) { ASSERT_TRUE(round->AddKeys(id, clients.at(id).advertised(), kStart).ok()); }
  void Share(uint64_t id) {
    const auto keys = round->KeysFor(id);
    ASSERT_TRUE(keys.has_value()) << id;
    ASSERT_TRUE(round->AddShares(id, *clients.at(id).ShareKeys(*keys, nullptr), kStart).ok());
  }
  void Mask(uint64_t id) {
    const auto shares = round->SharesFor(id);
    ASSERT_TRUE(shares.has_value()) << id;
    std::vector<uint32_t> input(setup.vector_length, static_cast<uint32_t>(id));
    auto masked = clients.at(id).MaskInput(*shares, input);
    ASSERT_TRUE(masked.ok()) << masked.status().ToString();
    ASSERT_TRUE(round->AddMaskedInput(id, secagg::PackRing(*masked, setup.ring_bits), kStart).ok());
    secagg::AddInto(expected, input, setup.ring_bits);
  }
  void Reveal(uint64_t id) {
    const auto survivors = round->SurvivorsFor(id);
    ASSERT_TRUE(survivors.has_value()) << id;
    ASSERT_TRUE(round->AddRevealed(id, *clients.at(id).Unmask(*survivors), kStart).ok());
  }

  secagg::RoundSetup setup;
  std::optional<SecureRound> round;
  std::map<uint64_t, Client> clients;
  std::vector<uint32_t> expected = std::vector<uint32_t>(9, 0);
};

TEST(SecureRoundTest, EachPhaseEndsWhenEveryWorkerHasSentAndTheSumComesOut) {
  Fixture f(5);
  for (uint64_t id = 1; id <= 4; ++id) f.Advertise(id);
  EXPECT_EQ(f.round->phase(), Phase::kAdvertise);  // worker 5 is still awaited
  EXPECT_FALSE(f.round->KeysFor(1).has_value());
  f.Advertise(5);
  EXPECT_EQ(f.round->phase(), Phase::kShare);
  for (uint64_t id = 1; id <= 5; ++id) f.Share(id);
  EXPECT_EQ(f.round->phase(), Phase::kMaskedInput);
  EXPECT_FALSE(f.round->SurvivorsFor(1).has_value());
  for (uint64_t id = 1; id <= 5; ++id) f.Mask(id);
  EXPECT_EQ(f.round->phase(), Phase::kUnmask);
  // Each secret needs share_threshold (4) shares: the fourth reveal ends the phase, and the fifth is not needed.
  ASSERT_EQ(f.setup.share_threshold, 4u);
  for (uint64_t id = 1; id <= 3; ++id) f.Reveal(id);
  EXPECT_EQ(f.round->phase(), Phase::kUnmask);
  f.Reveal(4);
  ASSERT_EQ(f.round->phase(), Phase::kRevealed);
  f.Reveal(5);  // answered OK, unused
  EXPECT_FALSE(f.round->deadline().has_value());
  auto sum = f.round->Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(*sum, f.expected);
  f.round->Unmasked(Status::Ok());
  EXPECT_EQ(f.round->phase(), Phase::kUnmasked);
  EXPECT_EQ(f.round->Unmask().status().code(), StatusCode::kFailedPrecondition);  // once
  const nlohmann::json participation = f.round->Participation();
  EXPECT_EQ(participation["revealed"], nlohmann::json({1, 2, 3, 4}));
  EXPECT_EQ(participation["phase"], "unmasked");
}

TEST(SecureRoundTest, AWorkerLostInAnyPhaseIsNotWaitedFor) {
  for (int lost_in = 0; lost_in < 4; ++lost_in) {
    Fixture f(6, 4);
    const uint64_t lost = 3;
    auto maybe_lose = [&](int phase) {
      if (phase == lost_in) f.round->WorkerLost(lost, kStart);
    };
    maybe_lose(0);
    for (uint64_t id = 1; id <= 6; ++id) {
      if (!(lost_in == 0 && id == lost)) f.Advertise(id);
    }
    maybe_lose(1);
    for (uint64_t id = 1; id <= 6; ++id) {
      if (!(lost_in <= 1 && id == lost)) f.Share(id);
    }
    maybe_lose(2);
    for (uint64_t id = 1; id <= 6; ++id) {
      if (!(lost_in <= 2 && id == lost)) f.Mask(id);
    }
    maybe_lose(3);
    for (uint64_t id = 1; id <= 6; ++id) {
      if (id != lost) f.Reveal(id);
    }
    ASSERT_EQ(f.round->phase(), Phase::kRevealed)
        << "lost in phase " << lost_in << ": " << f.round->failure().ToString();
    auto sum = f.round->Unmask();
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(*sum, f.expected) << "lost in phase " << lost_in;
  }
}

TEST(SecureRoundTest, ADeadlineEndsAPhaseWithThoseThatSent) {
  Fixture f(5, 3);
  for (uint64_t id = 1; id <= 4; ++id) f.Advertise(id);
  f.round->Tick(kStart + kPhaseTimeout - Clock::Duration{1});
  EXPECT_EQ(f.round->phase(), Phase::kAdvertise);
  EXPECT_EQ(*f.round->deadline(), kStart + kPhaseTimeout);
  f.round->Tick(kStart + kPhaseTimeout);
  EXPECT_EQ(f.round->phase(), Phase::kShare);
  EXPECT_FALSE(f.round->KeysFor(5).has_value());  // it advertised nothing: no place in phase 2
  EXPECT_EQ(f.round->AddKeys(5, f.clients.at(5).advertised(), kStart + kPhaseTimeout).code(),
            StatusCode::kFailedPrecondition);                   // too late
  EXPECT_EQ(*f.round->deadline(), kStart + 2 * kPhaseTimeout);  // the next phase has its own
}

TEST(SecureRoundTest, TheMaskedInputPhaseWaitsForTrainingAndEndsWhenTheRoundAggregates) {
  Fixture f(4, 3);
  for (uint64_t id = 1; id <= 4; ++id) f.Advertise(id);
  for (uint64_t id = 1; id <= 4; ++id) f.Share(id);
  EXPECT_EQ(*f.round->deadline(), kStart + 2 * kPhaseTimeout);  // training's allowance, not an exchange's
  for (uint64_t id = 1; id <= 3; ++id) f.Mask(id);
  f.round->EndMaskedInput(kStart);
  EXPECT_EQ(f.round->phase(), Phase::kUnmask);
  EXPECT_EQ(*f.round->SurvivorsFor(1), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_FALSE(f.round->SurvivorsFor(4).has_value());
  for (uint64_t id = 1; id <= 3; ++id) f.Reveal(id);
  ASSERT_EQ(f.round->phase(), Phase::kRevealed);
  EXPECT_EQ(*f.round->Unmask(), f.expected);
}

TEST(SecureRoundTest, AFailedUnmaskingFailsTheAttempt) {
  Fixture f(3, 2);
  for (uint64_t id = 1; id <= 3; ++id) f.Advertise(id);
  for (uint64_t id = 1; id <= 3; ++id) f.Share(id);
  for (uint64_t id = 1; id <= 3; ++id) f.Mask(id);
  for (uint64_t id = 1; id <= 3; ++id) f.Reveal(id);
  f.round->Unmasked(DataLossError("a share is corrupt"));
  EXPECT_EQ(f.round->phase(), Phase::kFailed);
  EXPECT_EQ(f.round->failure().code(), StatusCode::kDataLoss);
}

TEST(SecureRoundTest, TooFewWorkersFailTheAttemptWithTheReason) {
  Fixture f(5, 4);
  for (uint64_t id = 1; id <= 3; ++id) f.Advertise(id);
  f.round->WorkerLost(4, kStart);
  f.round->WorkerLost(5, kStart);  // everyone else has sent: the phase ends, with 3 of the 4 needed
  EXPECT_EQ(f.round->phase(), Phase::kFailed);
  EXPECT_EQ(f.round->failure().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(f.round->failure().message().find("3 workers advertised keys, below the threshold of 4"), std::string::npos)
      << f.round->failure().ToString();
  EXPECT_FALSE(f.round->KeysFor(1).has_value());
  EXPECT_FALSE(f.round->deadline().has_value());
  EXPECT_EQ(f.round->Participation()["phase"], "failed");
}

// A survivor that dies after its masked input and before revealing (nothing tells the round it is lost) holds nothing
// up once the others' shares suffice; and while Unmask runs off the loop no message reaches the server.
TEST(SecureRoundTest, UnmaskingDoesNotWaitForASurvivorWhoseSharesAreNotNeeded) {
  Fixture f(4, 2);
  ASSERT_EQ(f.setup.share_threshold, 3u);  // a majority of each secret's 4 holders
  for (uint64_t id = 1; id <= 4; ++id) f.Advertise(id);
  for (uint64_t id = 1; id <= 4; ++id) f.Share(id);
  for (uint64_t id = 1; id <= 4; ++id) f.Mask(id);
  for (uint64_t id = 1; id <= 3; ++id) f.Reveal(id);
  ASSERT_EQ(f.round->phase(), Phase::kRevealed);  // worker 4 never reveals, and is not lost
  EXPECT_EQ(f.round->AddKeys(1, f.clients.at(1).advertised(), kStart).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.round->AddMaskedInput(1, std::string(18, '\0'), kStart).code(), StatusCode::kFailedPrecondition);
  auto sum = f.round->Unmask();
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(*sum, f.expected);  // worker 4's input counts: its seed came from the others' shares
}

TEST(SecureRoundTest, MessagesOutOfTurnChangeNothing) {
  Fixture f(3, 2);
  EXPECT_EQ(f.round->AddKeys(9, f.clients.at(1).advertised(), kStart).code(), StatusCode::kPermissionDenied);
  f.Advertise(1);
  EXPECT_EQ(f.round->AddKeys(1, f.clients.at(1).advertised(), kStart).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(f.round->AddMaskedInput(1, std::string(18, '\0'), kStart).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.round->phase(), Phase::kAdvertise);
  EXPECT_EQ(f.round->Participation()["advertised"], nlohmann::json({1}));
}

}  // namespace
}  // namespace parsyn::coordinator
