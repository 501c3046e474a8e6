#include "secagg/server.h"

#include <algorithm>
#include <string>

#include "secagg/ring.h"

namespace parsyn::secagg {
namespace {

std::string Worker(uint64_t id) { return "worker " + std::to_string(id); }

Status EnoughLive(size_t live, const RoundSetup& setup, const char* what) {
  if (live >= setup.min_survivors) return Status::Ok();
  return FailedPreconditionError(std::to_string(live) + " workers " + what + ", below the threshold of " +
                                 std::to_string(setup.min_survivors) + ": the attempt fails");
}

}  // namespace

StatusOr<Server> Server::Start(RoundSetup setup) {
  PARSYN_RETURN_IF_ERROR(CheckRoundSetup(setup));
  Server server(std::move(setup));
  server.neighbors_ = AllNeighbors(server.setup_);
  return server;
}

Status Server::InPhase(Phase phase, const char* what) const {
  if (phase_ == phase) return Status::Ok();
  return FailedPreconditionError(std::string(what) + " arrived outside its phase of " + setup_.attempt);
}

bool Server::IsNeighbor(uint64_t a, uint64_t b) const {
  const auto it = neighbors_.find(a);
  return it != neighbors_.end() && std::binary_search(it->second.begin(), it->second.end(), b);
}

Status Server::AddAdvertisedKeys(uint64_t from, const AdvertisedKeys& keys, const KeyVerifier& verify) {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kAdvertise, "advertised keys"));
  if (keys.worker != from || !IsParticipant(setup_, from) || advertised_.count(from)) {
    return PermissionDeniedError(Worker(from) +
                                 " may not advertise these keys (not a participant, another "
                                 "worker's keys, or a second time)");
  }
  if (verify) PARSYN_RETURN_IF_ERROR(verify(setup_.attempt, keys));
  advertised_[from] = keys;
  return Status::Ok();
}

Status Server::EndAdvertising() {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kAdvertise, "the end of advertising"));
  PARSYN_RETURN_IF_ERROR(EnoughLive(advertised_.size(), setup_, "advertised keys"));
  phase_ = Phase::kShare;
  return Status::Ok();
}

std::vector<AdvertisedKeys> Server::KeysFor(uint64_t worker) const {
  std::vector<AdvertisedKeys> out;
  if (!advertised_.count(worker)) return out;
  for (uint64_t id : neighbors_.at(worker)) {
    if (const auto it = advertised_.find(id); it != advertised_.end()) out.push_back(it->second);
  }
  return out;
}

Status Server::AddSealedShares(uint64_t from, std::span<const SealedShare> shares) {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kShare, "sealed shares"));
  if (!advertised_.count(from) || shared_.count(from)) {
    return PermissionDeniedError(Worker(from) + " may not share keys (it advertised none, or it shared already)");
  }
  std::set<uint64_t> expected;
  for (uint64_t id : neighbors_.at(from)) {
    if (advertised_.count(id)) expected.insert(id);
  }
  std::set<uint64_t> seen;
  for (const SealedShare& share : shares) {
    if (share.from != from || !expected.count(share.to) || !seen.insert(share.to).second) {
      return PermissionDeniedError(Worker(from) + " sent a share for worker " + std::to_string(share.to) +
                                   ", which is not a neighbor that advertised keys, or twice");
    }
  }
  if (seen != expected) {
    return InvalidArgumentError(Worker(from) + " sent " + std::to_string(seen.size()) + " shares, and " +
                                std::to_string(expected.size()) + " neighbors advertised keys");
  }
  for (const SealedShare& share : shares) shares_to_[share.to].push_back(share);
  shared_.insert(from);
  return Status::Ok();
}

Status Server::EndSharing() {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kShare, "the end of sharing"));
  PARSYN_RETURN_IF_ERROR(EnoughLive(shared_.size(), setup_, "shared keys"));
  phase_ = Phase::kMaskedInput;
  return Status::Ok();
}

std::vector<SealedShare> Server::SharesFor(uint64_t worker) const {
  std::vector<SealedShare> out;
  if (!shared_.count(worker)) return out;
  if (const auto it = shares_to_.find(worker); it != shares_to_.end()) {
    for (const SealedShare& share : it->second) {
      if (shared_.count(share.from)) out.push_back(share);
    }
  }
  return out;
}

Status Server::AddMaskedInput(uint64_t from, std::string_view packed) {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kMaskedInput, "a masked input"));
  if (!shared_.count(from) || masked_.count(from)) {
    return PermissionDeniedError(Worker(from) + " may not send masked input (it shared no keys, or it sent one)");
  }
  if (sum_.empty()) sum_.assign(setup_.vector_length, 0);
  if (Status added = AddPacked(sum_, packed, setup_.ring_bits); !added.ok()) {
    return InvalidArgumentError("the masked input of " + Worker(from) + ": " + std::string(added.message()));
  }
  masked_.insert(from);
  return Status::Ok();
}

Status Server::EndMasking() {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kMaskedInput, "the end of masked input"));
  PARSYN_RETURN_IF_ERROR(EnoughLive(masked_.size(), setup_, "sent masked input"));
  survivors_.assign(masked_.begin(), masked_.end());
  phase_ = Phase::kUnmask;
  return Status::Ok();
}

Status Server::CheckRevealed(uint64_t from, const RevealedShare& share) const {
  const bool owner_shared = shared_.count(share.owner) > 0;
  const bool may_hold = share.owner == from || (IsNeighbor(from, share.owner) && owner_shared);
  const SecretKind expected = masked_.count(share.owner) ? SecretKind::kSeed : SecretKind::kMaskingKey;
  if (!may_hold || share.kind != expected || share.share.x != SharePoint(setup_, from) ||
      share.share.y.size() != ShamirChunks(kSharedSecretBytes)) {
    return PermissionDeniedError(Worker(from) + " revealed a share of worker " + std::to_string(share.owner) +
                                 " it does not hold, or of the wrong secret");
  }
  return Status::Ok();
}

Status Server::AddRevealedShares(uint64_t from, std::span<const RevealedShare> shares) {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kUnmask, "revealed shares"));
  if (!masked_.count(from) || revealed_by_.count(from)) {
    return PermissionDeniedError(Worker(from) + " may not reveal shares (it is not a survivor, or it revealed)");
  }
  std::set<uint64_t> owners;
  for (const RevealedShare& share : shares) {
    PARSYN_RETURN_IF_ERROR(CheckRevealed(from, share));
    if (!owners.insert(share.owner).second) {
      return PermissionDeniedError(Worker(from) + " revealed two shares of worker " + std::to_string(share.owner));
    }
  }
  for (const RevealedShare& share : shares) {
    (share.kind == SecretKind::kSeed ? seed_shares_ : key_shares_)[share.owner].push_back(share.share);
  }
  revealed_by_.insert(from);
  return Status::Ok();
}

StatusOr<Key32> Server::Rebuild(uint64_t owner, SecretKind kind) const {
  const auto& by_owner = kind == SecretKind::kSeed ? seed_shares_ : key_shares_;
  const auto it = by_owner.find(owner);
  const std::vector<ShamirShare> none;
  const std::vector<ShamirShare>& shares = it == by_owner.end() ? none : it->second;
  const char* what = kind == SecretKind::kSeed ? "self-mask seed" : "masking key";
  StatusOr<std::vector<unsigned char>> secret = CombineShares(shares, setup_.share_threshold, kSharedSecretBytes);
  if (!secret.ok()) {
    if (secret.status().code() == StatusCode::kFailedPrecondition) {
      return FailedPreconditionError("the " + std::string(what) + " of " + Worker(owner) + " has " +
                                     std::to_string(shares.size()) + " of the " +
                                     std::to_string(setup_.share_threshold) + " shares it needs");
    }
    return DataLossError("the " + std::string(what) + " of " + Worker(owner) + " does not rebuild: a share is corrupt");
  }
  Key32 key{};
  std::copy(secret->begin(), secret->end(), key.begin());
  const AdvertisedKeys& advertised = advertised_.at(owner);
  if (kind == SecretKind::kSeed) {
    if (SeedCommitment(setup_.attempt, owner, key) != advertised.seed_commitment) {
      return DataLossError("the rebuilt self-mask seed of " + Worker(owner) + " is not the one it committed to");
    }
  } else {
    PARSYN_ASSIGN_OR_RETURN(const Key32 public_key, X25519PublicKey(key));
    if (public_key != advertised.masking_key) {
      return DataLossError("the rebuilt masking key of " + Worker(owner) + " is not the one it advertised");
    }
  }
  return key;
}

bool Server::HasSharesToUnmask() const {
  if (phase_ != Phase::kUnmask) return false;
  auto enough = [&](const std::map<uint64_t, std::vector<ShamirShare>>& by_owner, uint64_t owner) {
    const auto it = by_owner.find(owner);
    return it != by_owner.end() && it->second.size() >= setup_.share_threshold;
  };
  for (uint64_t id : survivors_) {
    if (!enough(seed_shares_, id)) return false;
  }
  for (uint64_t dropped : shared_) {  // as Unmask: the masking key of each that shared and sent no input
    if (!masked_.count(dropped) && !enough(key_shares_, dropped)) return false;
  }
  return true;
}

StatusOr<std::vector<uint32_t>> Server::Unmask() {
  PARSYN_RETURN_IF_ERROR(InPhase(Phase::kUnmask, "unmasking"));
  std::vector<SignedSeed> masks;
  for (uint64_t id : survivors_) {
    PARSYN_ASSIGN_OR_RETURN(const Key32 seed, Rebuild(id, SecretKind::kSeed));
    masks.push_back({seed, -1});
  }
  for (uint64_t dropped : shared_) {
    if (masked_.count(dropped)) continue;
    PARSYN_ASSIGN_OR_RETURN(const Key32 key, Rebuild(dropped, SecretKind::kMaskingKey));
    for (uint64_t id : neighbors_.at(dropped)) {
      if (!masked_.count(id)) continue;
      // The survivor added its pair's mask with sign PairMaskSign(id, dropped); it comes off with the other sign.
      PARSYN_ASSIGN_OR_RETURN(const Key32 seed, PairMaskSeed(setup_, key, advertised_.at(id).masking_key, dropped, id));
      masks.push_back({seed, -PairMaskSign(id, dropped)});
    }
  }
  ApplyMasks(masks, setup_.ring_bits, sum_);
  phase_ = Phase::kDone;
  return std::move(sum_);
}

}  // namespace parsyn::secagg
