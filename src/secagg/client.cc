#include "secagg/client.h"

#include <algorithm>
#include <set>

#include "secagg/ring.h"

namespace parsyn::secagg {
namespace {

std::string PairInfo(std::string_view use, const RoundSetup& setup, uint64_t a, uint64_t b) {
  return "parsyn secure aggregation " + std::string(use) + " v1\n" + setup.attempt + "\n" +
         std::to_string(std::min(a, b)) + "\n" + std::to_string(std::max(a, b));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(std::string_view bytes, size_t at) {
  uint64_t v = 0;
  for (size_t i = 8; i > 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i - 1]);
  return v;
}

// A share's plaintext: owner, holder, point, then the seed's and the masking key's field elements, little-endian.
std::string EncodeShares(uint64_t owner, uint64_t holder, const ShamirShare& seed, const ShamirShare& key) {
  std::string out;
  PutU64(out, owner);
  PutU64(out, holder);
  PutU64(out, seed.x);
  for (uint64_t y : seed.y) PutU64(out, y);
  for (uint64_t y : key.y) PutU64(out, y);
  return out;
}

}  // namespace

StatusOr<Key32> PairSealingKey(const RoundSetup& setup, const Key32& own_private, const Key32& peer_public, uint64_t a,
                               uint64_t b) {
  return AgreeKey(own_private, peer_public, PairInfo("sealing", setup, a, b));
}

StatusOr<Key32> PairMaskSeed(const RoundSetup& setup, const Key32& own_private, const Key32& peer_public, uint64_t a,
                             uint64_t b) {
  return AgreeKey(own_private, peer_public, PairInfo("mask", setup, a, b));
}

StatusOr<Client> Client::Start(const RoundSetup& setup, uint64_t self, const KeySigner& signer) {
  PARSYN_RETURN_IF_ERROR(CheckRoundSetup(setup));
  if (!IsParticipant(setup, self)) {
    return InvalidArgumentError("worker " + std::to_string(self) + " is not a participant of " + setup.attempt);
  }
  Client client(setup, self);
  PARSYN_ASSIGN_OR_RETURN(client.sealing_, GenerateX25519KeyPair());
  PARSYN_ASSIGN_OR_RETURN(client.masking_, GenerateX25519KeyPair());
  PARSYN_ASSIGN_OR_RETURN(client.seed_, RandomKey());
  client.neighbors_ = Neighbors(setup, self);
  AdvertisedKeys& keys = client.advertised_;
  keys.worker = self;
  keys.sealing_key = client.sealing_.public_key;
  keys.masking_key = client.masking_.public_key;
  keys.seed_commitment = SeedCommitment(setup.attempt, self, client.seed_);
  if (signer.sign) {
    PARSYN_ASSIGN_OR_RETURN(keys.signature, signer.sign(SignedBytes(setup.attempt, keys)));
    keys.certificate = signer.certificate_pem;
  }
  return client;
}

std::string Client::ShareAssociatedData(uint64_t owner, uint64_t holder) const {
  return "parsyn secure aggregation share v1\n" + setup_.attempt + "\n" + std::to_string(owner) + "\n" +
         std::to_string(holder);
}

StatusOr<std::vector<SealedShare>> Client::ShareKeys(std::span<const AdvertisedKeys> neighbor_keys,
                                                     const KeyVerifier& verify) {
  if (phase_ != Phase::kAdvertised) return FailedPreconditionError("keys are shared once, after advertising them");
  // Every key is checked before any is kept: a refusal leaves this worker as it was.
  std::set<Key32> public_keys = {sealing_.public_key, masking_.public_key};
  std::map<uint64_t, AdvertisedKeys> accepted;
  for (const AdvertisedKeys& keys : neighbor_keys) {
    const std::string who = "worker " + std::to_string(keys.worker);
    if (!std::binary_search(neighbors_.begin(), neighbors_.end(), keys.worker) || accepted.count(keys.worker)) {
      return PermissionDeniedError("the keys of " + who + " were forwarded, and it is not a neighbor, or twice");
    }
    if (!public_keys.insert(keys.sealing_key).second || !public_keys.insert(keys.masking_key).second) {
      return PermissionDeniedError("the keys of " + who + " repeat a key already seen in this attempt");
    }
    if (verify) PARSYN_RETURN_IF_ERROR(verify(setup_.attempt, keys));
    accepted[keys.worker] = keys;
  }
  if (accepted.size() + 1 < setup_.share_threshold) {
    return FailedPreconditionError(std::to_string(accepted.size()) +
                                   " neighbors advertised keys, and rebuilding a "
                                   "secret takes " +
                                   std::to_string(setup_.share_threshold) + " holders");
  }
  peer_keys_ = std::move(accepted);
  std::vector<uint32_t> points = {SharePoint(setup_, self_)};
  for (const auto& [id, keys] : peer_keys_) points.push_back(SharePoint(setup_, id));
  PARSYN_ASSIGN_OR_RETURN(std::vector<ShamirShare> seed_shares, SplitSecret(seed_, setup_.share_threshold, points));
  PARSYN_ASSIGN_OR_RETURN(std::vector<ShamirShare> key_shares,
                          SplitSecret(masking_.private_key, setup_.share_threshold, points));
  own_shares_ = HeldShares{seed_shares[0], key_shares[0]};
  std::vector<SealedShare> out;
  size_t i = 1;
  for (const auto& [id, keys] : peer_keys_) {
    PARSYN_ASSIGN_OR_RETURN(const Key32 key, PairSealingKey(setup_, sealing_.private_key, keys.sealing_key, self_, id));
    const std::string plaintext = EncodeShares(self_, id, seed_shares[i], key_shares[i]);
    PARSYN_ASSIGN_OR_RETURN(std::string sealed, Seal(key, ShareAssociatedData(self_, id), plaintext));
    out.push_back({self_, id, std::move(sealed)});
    ++i;
  }
  phase_ = Phase::kShared;
  return out;
}

StatusOr<Client::HeldShares> Client::OpenShare(const SealedShare& share) const {
  const auto peer = peer_keys_.find(share.from);
  if (share.to != self_ || peer == peer_keys_.end()) {
    return PermissionDeniedError("a share from worker " + std::to_string(share.from) + " to " +
                                 std::to_string(share.to) + " was forwarded to worker " + std::to_string(self_) +
                                 ", which took no keys from it");
  }
  PARSYN_ASSIGN_OR_RETURN(const Key32 key,
                          PairSealingKey(setup_, sealing_.private_key, peer->second.sealing_key, self_, share.from));
  PARSYN_ASSIGN_OR_RETURN(const std::string plain, Open(key, ShareAssociatedData(share.from, self_), share.sealed));
  const size_t chunks = ShamirChunks(kSharedSecretBytes);
  const uint32_t point = SharePoint(setup_, self_);
  if (plain.size() != 24 + 16 * chunks || GetU64(plain, 0) != share.from || GetU64(plain, 8) != self_ ||
      GetU64(plain, 16) != point) {
    return PermissionDeniedError("the share from worker " + std::to_string(share.from) + " is not one for worker " +
                                 std::to_string(self_));
  }
  HeldShares held{{point, std::vector<uint64_t>(chunks)}, {point, std::vector<uint64_t>(chunks)}};
  for (size_t c = 0; c < chunks; ++c) {
    held.seed.y[c] = GetU64(plain, 24 + 8 * c);
    held.masking_key.y[c] = GetU64(plain, 24 + 8 * (chunks + c));
    if (held.seed.y[c] >= kShamirPrime || held.masking_key.y[c] >= kShamirPrime) {
      return PermissionDeniedError("the share from worker " + std::to_string(share.from) + " is not a field element");
    }
  }
  return held;
}

StatusOr<std::vector<uint32_t>> Client::MaskInput(std::span<const SealedShare> received, std::vector<uint32_t> input) {
  if (phase_ != Phase::kShared) return FailedPreconditionError("the input is masked once, after sharing keys");
  if (input.size() != setup_.vector_length) {
    return InvalidArgumentError("the quantized update has " + std::to_string(input.size()) + " elements, not " +
                                std::to_string(setup_.vector_length));
  }
  const uint32_t ring_mask = RingMask(setup_.ring_bits);
  for (uint32_t v : input) {
    if (v > ring_mask) return InvalidArgumentError("a quantized value does not fit the ring");
  }
  std::map<uint64_t, HeldShares> opened;  // kept only once every share opened
  for (const SealedShare& share : received) {
    if (opened.count(share.from)) {
      return PermissionDeniedError("two shares from worker " + std::to_string(share.from) + " were forwarded");
    }
    PARSYN_ASSIGN_OR_RETURN(HeldShares held, OpenShare(share));
    opened.emplace(share.from, std::move(held));
  }
  held_ = std::move(opened);
  std::vector<SignedSeed> masks = {{seed_, 1}};
  for (const auto& [id, held] : held_) {
    PARSYN_ASSIGN_OR_RETURN(const Key32 seed,
                            PairMaskSeed(setup_, masking_.private_key, peer_keys_.at(id).masking_key, self_, id));
    masks.push_back({seed, PairMaskSign(self_, id)});
  }
  ApplyMasks(masks, setup_.ring_bits, input);
  phase_ = Phase::kMasked;
  return input;
}

StatusOr<std::vector<RevealedShare>> Client::Unmask(std::span<const uint64_t> survivors) {
  if (phase_ != Phase::kMasked) return FailedPreconditionError("shares are revealed once, after masking the input");
  const std::set<uint64_t> alive(survivors.begin(), survivors.end());
  if (alive.size() != survivors.size()) return PermissionDeniedError("the survivors name a worker twice");
  if (!alive.count(self_)) {
    return PermissionDeniedError("the survivors leave out worker " + std::to_string(self_) +
                                 ", which sent its masked input");
  }
  for (uint64_t id : alive) {
    if (!IsParticipant(setup_, id)) {
      return PermissionDeniedError("the survivors name worker " + std::to_string(id) + ", not a participant");
    }
  }
  if (alive.size() < setup_.min_survivors) {
    return FailedPreconditionError(std::to_string(alive.size()) + " workers sent masked input, below the threshold " +
                                   std::to_string(setup_.min_survivors));
  }
  for (uint64_t id : neighbors_) {
    if (alive.count(id) && !held_.count(id)) {
      return PermissionDeniedError("worker " + std::to_string(id) +
                                   " is said to have sent masked input, and it "
                                   "shared no keys with worker " +
                                   std::to_string(self_));
    }
  }
  phase_ = Phase::kRevealed;
  std::vector<RevealedShare> out = {{self_, SecretKind::kSeed, own_shares_->seed}};
  for (const auto& [id, held] : held_) {
    if (alive.count(id)) {
      out.push_back({id, SecretKind::kSeed, held.seed});
    } else {
      out.push_back({id, SecretKind::kMaskingKey, held.masking_key});
    }
  }
  return out;
}

}  // namespace parsyn::secagg
