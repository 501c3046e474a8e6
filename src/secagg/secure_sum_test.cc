// The four phases of secure aggregation end to end, in process: workers (Client) and the coordinator (Server)
// exchange their messages as JSON, and the unmasked sum must equal the plain sum of the survivors' inputs, bit for
// bit, whatever drops out where, or the attempt fails cleanly when too few survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "secagg/client.h"
#include "secagg/ring.h"
#include "secagg/server.h"

namespace parsyn::secagg {
namespace {

using nlohmann::json;

// Where a worker drops out: before it advertises, before it shares, before it sends its masked input, before it
// reveals its shares; or never.
enum class DropAt { kAdvertise, kShare, kMaskedInput, kUnmask, kNever };

struct Outcome {
  Status status;
  std::vector<uint32_t> sum;       // the unmasked sum, when status is OK
  std::vector<uint32_t> expected;  // the plain sum of the inputs of the workers whose inputs the coordinator took
  size_t survivors = 0;
};

// The value of what must succeed; a failure ends the test binary with its message (a release build has no assert).
template <typename T>
T Must(StatusOr<T> value) {
  if (!value.ok()) {
    std::fprintf(stderr, "unexpected failure: %s\n", value.status().ToString().c_str());
    std::abort();
  }
  return *std::move(value);
}

// Every message goes through its JSON form, as it would on the wire.
template <typename T, typename Parse>
std::vector<T> OverTheWire(const std::vector<T>& items, Parse parse) {
  std::vector<T> out;
  for (const T& item : items) out.push_back(Must(parse(json::parse(ToJson(item).dump()))));
  return out;
}

Outcome RunAttempt(const RoundSetup& setup, const std::map<uint64_t, DropAt>& drops, std::mt19937& rng) {
  Outcome outcome;
  auto server = Server::Start(Must(ParseRoundSetup(json::parse(ToJson(setup).dump()))));
  if (!server.ok()) return {server.status()};
  std::map<uint64_t, Client> clients;
  std::map<uint64_t, std::vector<uint32_t>> inputs;
  auto alive_at = [&](uint64_t id, DropAt phase) { return drops.at(id) > phase; };
  for (uint64_t id : setup.participants) {
    if (!alive_at(id, DropAt::kAdvertise)) continue;
    clients.emplace(id, Must(Client::Start(setup, id, KeySigner{})));
    const AdvertisedKeys keys = Must(ParseAdvertisedKeys(json::parse(ToJson(clients.at(id).advertised()).dump())));
    if (Status s = server->AddAdvertisedKeys(id, keys, nullptr); !s.ok()) return {s};
  }
  if (Status s = server->EndAdvertising(); !s.ok()) return {s};
  for (auto& [id, client] : clients) {
    if (!alive_at(id, DropAt::kShare)) continue;
    auto shares = client.ShareKeys(OverTheWire(server->KeysFor(id), ParseAdvertisedKeys), nullptr);
    if (!shares.ok()) continue;  // too few neighbors left to share with: this worker drops out
    if (Status s = server->AddSealedShares(id, OverTheWire(*shares, ParseSealedShare)); !s.ok()) return {s};
  }
  if (Status s = server->EndSharing(); !s.ok()) return {s};
  outcome.expected.assign(setup.vector_length, 0);
  for (auto& [id, client] : clients) {
    const std::vector<SealedShare> mine = server->SharesFor(id);
    if (!alive_at(id, DropAt::kMaskedInput)) continue;
    std::vector<uint32_t> input(setup.vector_length);
    for (uint32_t& v : input) v = rng() & ((1u << setup.quantization_bits) - 1);
    auto masked = client.MaskInput(OverTheWire(mine, ParseSealedShare), input);
    if (!masked.ok()) continue;  // it did not share: the coordinator forwards it nothing and it has no place here
    if (Status s = server->AddMaskedInput(id, PackRing(*masked, setup.ring_bits)); !s.ok()) return {s};
    AddInto(outcome.expected, input, setup.ring_bits);
  }
  if (Status s = server->EndMasking(); !s.ok()) return {s};
  outcome.survivors = server->survivors().size();
  for (uint64_t id : server->survivors()) {
    if (!alive_at(id, DropAt::kUnmask)) continue;
    auto revealed = clients.at(id).Unmask(server->survivors());
    if (!revealed.ok()) return {revealed.status()};
    if (Status s = server->AddRevealedShares(id, OverTheWire(*revealed, ParseRevealedShare)); !s.ok()) return {s};
  }
  auto sum = server->Unmask();
  if (!sum.ok()) return {sum.status()};
  outcome.sum = std::move(*sum);
  return outcome;
}

std::vector<uint64_t> RandomIds(size_t n, std::mt19937& rng) {
  std::set<uint64_t> ids;
  while (ids.size() < n) ids.insert(1 + rng() % 1000);
  return {ids.begin(), ids.end()};
}

TEST(SecureSumTest, TheUnmaskedSumIsThePlainSumOfTheSurvivorsInputsWhateverDropsWhere) {
  std::mt19937 rng(20261205);
  int committed = 0, failed = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const size_t n = 2 + rng() % 49;
    const size_t threshold = 2 + rng() % (n - 1);
    const size_t neighbors = 1 + rng() % (n - 1);
    const int bits = rng() % 2 ? 8 : 16;
    const size_t length = 1 + rng() % 300;
    const std::vector<uint64_t> ids = RandomIds(n, rng);
    auto setup = MakeRoundSetup("trial " + std::to_string(trial), ids, threshold, neighbors, bits, 1.0, length + 1,
                                *RandomKey());
    ASSERT_TRUE(setup.ok()) << setup.status().ToString();
    const double drop_rate = (rng() % 4) * 0.08;
    std::map<uint64_t, DropAt> drops;
    for (uint64_t id : ids) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      drops[id] = u < drop_rate ? static_cast<DropAt>(rng() % 4) : DropAt::kNever;
    }
    const Outcome outcome = RunAttempt(*setup, drops, rng);
    if (outcome.status.ok()) {
      ++committed;
      EXPECT_EQ(outcome.sum, outcome.expected) << "trial " << trial << ": n " << n << ", threshold " << threshold;
    } else {
      ++failed;
      // Only for want of live workers or shares: never a wrong sum, never a refused honest message.
      EXPECT_EQ(outcome.status.code(), StatusCode::kFailedPrecondition) << outcome.status.ToString();
    }
  }
  EXPECT_GT(committed, 30);  // the property was checked on many committed attempts
  EXPECT_GT(failed, 0);      // and some attempts had too few survivors
}

TEST(SecureSumTest, EveryPhaseSurvivesADropoutWhileEnoughSurvive) {
  std::mt19937 rng(7);
  for (size_t n : {10u, 30u}) {
    const std::vector<uint64_t> ids = RandomIds(n, rng);
    // Four drop out, so at most n - 4 can reveal shares: the threshold must allow that many.
    const size_t threshold = std::min(DefaultThreshold(n), n - 4);
    const RoundSetup setup = *MakeRoundSetup("drops", ids, threshold, DefaultNeighbors(n), 16, 1.0, 50, *RandomKey());
    std::map<uint64_t, DropAt> drops;
    for (uint64_t id : ids) drops[id] = DropAt::kNever;
    drops[ids[1]] = DropAt::kAdvertise;
    drops[ids[3]] = DropAt::kShare;
    drops[ids[5]] = DropAt::kMaskedInput;
    drops[ids[7]] = DropAt::kUnmask;
    const Outcome outcome = RunAttempt(setup, drops, rng);
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.ToString();
    EXPECT_EQ(outcome.survivors, n - 3);  // the one lost after sending its input is in the sum
    EXPECT_EQ(outcome.sum, outcome.expected);
  }
}

TEST(SecureSumTest, ARefusedForwardLeavesTheWorkerAsItWas) {
  const RoundSetup setup = *MakeRoundSetup("refused", {1, 2, 3, 4}, 3, 3, 16, 1.0, 8, *RandomKey());
  Server server = Must(Server::Start(setup));
  std::map<uint64_t, Client> clients;
  for (uint64_t id : setup.participants) {
    clients.emplace(id, Must(Client::Start(setup, id, KeySigner{})));
    ASSERT_TRUE(server.AddAdvertisedKeys(id, clients.at(id).advertised(), nullptr).ok());
  }
  ASSERT_TRUE(server.EndAdvertising().ok());
  std::vector<AdvertisedKeys> forwarded = server.KeysFor(1);
  forwarded.push_back(forwarded.front());  // a neighbor's keys twice
  EXPECT_EQ(clients.at(1).ShareKeys(forwarded, nullptr).status().code(), StatusCode::kPermissionDenied);
  forwarded.pop_back();
  auto shares = clients.at(1).ShareKeys(forwarded, nullptr);  // the genuine list is still taken
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_EQ(shares->size(), 3u);
}

TEST(SecureSumTest, TooFewSurvivorsFailTheAttemptInTheirPhase) {
  std::mt19937 rng(8);
  const std::vector<uint64_t> ids = {1, 2, 3, 4, 5, 6};
  const RoundSetup setup = *MakeRoundSetup("few", ids, 4, 5, 16, 1.0, 20, *RandomKey());
  for (DropAt phase : {DropAt::kAdvertise, DropAt::kShare, DropAt::kMaskedInput, DropAt::kUnmask}) {
    std::map<uint64_t, DropAt> drops;
    for (uint64_t id : ids) drops[id] = id <= 3 ? phase : DropAt::kNever;
    const Outcome outcome = RunAttempt(setup, drops, rng);
    EXPECT_EQ(outcome.status.code(), StatusCode::kFailedPrecondition) << static_cast<int>(phase);
  }
}

}  // namespace
}  // namespace parsyn::secagg
