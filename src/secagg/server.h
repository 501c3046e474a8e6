// The coordinator's side of one secure-aggregation attempt: it collects and forwards what the workers send each
// other, keeps the running sum of the masked inputs (one vector: memory O(model), not O(workers x model)), and at the
// end rebuilds, from the survivors' revealed shares, the seed of each worker whose input it summed and the masking key
// of each that shared and then dropped, and takes their masks off. It never holds a single unmasked update.
//
// Phases in order: advertise (AddAdvertisedKeys ... EndAdvertising), share (AddSealedShares ... EndSharing), masked
// input (AddMaskedInput ... EndMasking), unmask (AddRevealedShares ... Unmask). A message outside its phase, from a
// worker outside the phase's live set, or twice, is refused (FailedPrecondition or PermissionDenied) and changes
// nothing. An End* with fewer than setup.min_survivors live workers fails the attempt (FailedPrecondition); the
// caller starts a new attempt with a new setup. One thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "secagg/client.h"
#include "secagg/messages.h"
#include "secagg/round_setup.h"

namespace parsyn::secagg {

class Server {
 public:
  // InvalidArgument if the setup does not pass CheckRoundSetup.
  static StatusOr<Server> Start(RoundSetup setup);

  const RoundSetup& setup() const { return setup_; }

  // Phase 1. `from` is the authenticated sender; its keys must name it, and pass `verify` when given.
  Status AddAdvertisedKeys(uint64_t from, const AdvertisedKeys& keys, const KeyVerifier& verify);
  Status EndAdvertising();
  // What a worker that advertised takes into phase 2: its neighbors' advertised keys.
  std::vector<AdvertisedKeys> KeysFor(uint64_t worker) const;

  // Phase 2: one sealed share from `from` for each of its neighbors that advertised.
  Status AddSealedShares(uint64_t from, std::span<const SealedShare> shares);
  Status EndSharing();
  // What a worker that shared takes into phase 3: the shares sealed for it by its neighbors that shared.
  std::vector<SealedShare> SharesFor(uint64_t worker) const;

  // Phase 3: a worker that shared sends its masked input, packed (PackRing); it is added into the sum at once.
  Status AddMaskedInput(uint64_t from, std::string_view packed);
  Status EndMasking();
  // The workers whose masked inputs are in the sum (phase 4's survivors), ascending.
  const std::vector<uint64_t>& survivors() const { return survivors_; }

  // Phase 4: a survivor's revealed shares: one per neighbor that shared (its seed if it survived, else its masking
  // key) and its own seed's.
  Status AddRevealedShares(uint64_t from, std::span<const RevealedShare> shares);
  // Whether every secret Unmask needs has setup.share_threshold shares (phase 4 only): the shares still to come
  // are not needed.
  bool HasSharesToUnmask() const;
  // The unmasked sum of the survivors' inputs, once every secret it needs has setup.share_threshold shares
  // (FailedPrecondition naming the first that has not). DataLoss naming the worker whose rebuilt secret does not
  // match what it advertised (a corrupt share). Called once; the sum is moved out.
  StatusOr<std::vector<uint32_t>> Unmask();

 private:
  enum class Phase { kAdvertise, kShare, kMaskedInput, kUnmask, kDone };
  explicit Server(RoundSetup setup) : setup_(std::move(setup)) {}
  Status InPhase(Phase phase, const char* what) const;
  bool IsNeighbor(uint64_t a, uint64_t b) const;
  Status CheckRevealed(uint64_t from, const RevealedShare& share) const;
  StatusOr<Key32> Rebuild(uint64_t owner, SecretKind kind) const;

  RoundSetup setup_;
  Phase phase_ = Phase::kAdvertise;
  std::map<uint64_t, std::vector<uint64_t>> neighbors_;
  std::map<uint64_t, AdvertisedKeys> advertised_;           // U1
  std::map<uint64_t, std::vector<SealedShare>> shares_to_;  // by holder
  std::set<uint64_t> shared_;                               // U2
  std::set<uint64_t> masked_;                               // U3, as inputs arrive
  std::vector<uint64_t> survivors_;                         // U3, fixed by EndMasking
  std::vector<uint32_t> sum_;
  std::set<uint64_t> revealed_by_;
  std::map<uint64_t, std::vector<ShamirShare>> seed_shares_;  // by owner
  std::map<uint64_t, std::vector<ShamirShare>> key_shares_;   // by owner
};

}  // namespace parsyn::secagg
