// A worker's side of one secure-aggregation attempt (SecAgg+): it advertises two fresh X25519 keys and a commitment
// to a fresh self-mask seed, shares the seed and its masking key among its neighbors (Shamir, each share sealed for
// its holder), masks its quantized update with the seed's mask and one pairwise mask per neighbor that shared, and
// at the end reveals, for each neighbor, the share of exactly one of its secrets: the seed of one that sent its masked
// input, the masking key of one that did not. Every message of the coordinator is checked before it is used: it
// forwards, it is not trusted. One Client per attempt; its phases in order, each once (FailedPrecondition otherwise).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "secagg/crypto.h"
#include "secagg/messages.h"
#include "secagg/round_setup.h"

namespace parsyn::secagg {

// Signs the bytes of SignedBytes with the worker's certificate key (mutual TLS), and names the certificate its peers
// check the signature with. A default KeySigner (no `sign`) leaves keys unsigned: the honest-but-curious model.
struct KeySigner {
  std::string certificate_pem;
  std::function<StatusOr<std::string>(std::string_view bytes)> sign;
};
// Checks a peer's advertised keys (its signature against the CA and its worker name); null accepts any keys (the
// honest-but-curious coordinator model).
using KeyVerifier = std::function<Status(const std::string& attempt, const AdvertisedKeys& keys)>;

// The pair's key for sealing shares and its pairwise mask seed, from one side's private and the other's public key.
StatusOr<Key32> PairSealingKey(const RoundSetup& setup, const Key32& own_private, const Key32& peer_public, uint64_t a,
                               uint64_t b);
StatusOr<Key32> PairMaskSeed(const RoundSetup& setup, const Key32& own_private, const Key32& peer_public, uint64_t a,
                             uint64_t b);
// The sign with which `worker` adds its pair's mask with `peer`: + for the lower id, - for the higher.
inline int PairMaskSign(uint64_t worker, uint64_t peer) { return worker < peer ? 1 : -1; }

class Client {
 public:
  // Phase 1: checks the setup (CheckRoundSetup; InvalidArgument) and that `self` takes part, makes the keys and the
  // seed, and signs them with `signer` when it can sign.
  static StatusOr<Client> Start(const RoundSetup& setup, uint64_t self, const KeySigner& signer);
  uint64_t self() const { return self_; }

  const AdvertisedKeys& advertised() const { return advertised_; }
  const RoundSetup& setup() const { return setup_; }

  // Phase 2: the advertised keys of the neighbors that advertised, as forwarded. Each must be a neighbor's, once,
  // with distinct public keys, and pass `verify` (PermissionDenied naming the worker). FailedPrecondition if too few
  // holders remain for a secret to be rebuilt. One sealed share per neighbor listed; this worker keeps its own.
  StatusOr<std::vector<SealedShare>> ShareKeys(std::span<const AdvertisedKeys> neighbor_keys,
                                               const KeyVerifier& verify);

  // Phase 3: the shares sealed for this worker by neighbors (from neighbors whose keys it took, once each), opened
  // and kept; PermissionDenied naming a neighbor whose share does not open or does not fit. Returns `input` (the
  // quantized update, setup.vector_length elements) plus the seed's mask and the pairwise masks with those neighbors.
  StatusOr<std::vector<uint32_t>> MaskInput(std::span<const SealedShare> received, std::vector<uint32_t> input);

  // Phase 4: the workers whose masked input the coordinator took. They must include this worker, be participants,
  // at least setup.min_survivors, and hold no neighbor that did not share. One revealed share per neighbor that
  // shared, and this worker's own seed share.
  StatusOr<std::vector<RevealedShare>> Unmask(std::span<const uint64_t> survivors);

 private:
  enum class Phase { kAdvertised, kShared, kMasked, kRevealed };
  struct HeldShares {  // a neighbor's shares of its seed and masking key, as opened in phase 3
    ShamirShare seed;
    ShamirShare masking_key;
  };

  Client(RoundSetup setup, uint64_t self) : setup_(std::move(setup)), self_(self) {}
  std::string ShareAssociatedData(uint64_t owner, uint64_t holder) const;
  StatusOr<HeldShares> OpenShare(const SealedShare& share) const;

  RoundSetup setup_;
  uint64_t self_ = 0;
  Phase phase_ = Phase::kAdvertised;
  X25519KeyPair sealing_;
  X25519KeyPair masking_;
  Key32 seed_{};
  AdvertisedKeys advertised_;
  std::vector<uint64_t> neighbors_;
  std::map<uint64_t, AdvertisedKeys> peer_keys_;  // neighbors that advertised (phase 2)
  std::optional<HeldShares> own_shares_;
  std::map<uint64_t, HeldShares> held_;  // neighbors that shared (phase 3)
};

}  // namespace parsyn::secagg
