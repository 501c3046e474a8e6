// The messages of a secure-aggregation attempt, as typed structs with one JSON reader and writer each: what a worker
// advertises (phase 1), the shares it seals for its neighbors (phase 2), and what it reveals for unmasking (phase 4).
// Phase 3's masked input is a vector of ring elements (ring.h's PackRing). Readers take untrusted JSON and refuse
// anything malformed with InvalidArgument naming the field; they never throw.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "secagg/crypto.h"
#include "secagg/quantization.h"
#include "secagg/round_setup.h"
#include "secagg/shamir.h"

namespace parsyn::secagg {

// A worker shares two secrets of this size: its self-mask seed and its masking key's private half.
inline constexpr size_t kSharedSecretBytes = sizeof(Key32);

// Phase 1: a worker's two public keys (one for sealing shares, one for masks) and a commitment to its self-mask
// seed, signed under mutual TLS with its certificate's key (empty signature otherwise).
struct AdvertisedKeys {
  uint64_t worker = 0;
  Key32 sealing_key{};
  Key32 masking_key{};
  Key32 seed_commitment{};
  std::string signature;    // raw bytes, over SignedBytes
  std::string certificate;  // the signer's certificate (PEM), for peers to check against the CA
  bool operator==(const AdvertisedKeys&) const = default;
};

// The bytes a worker signs: the attempt and everything it advertises, so that no key moves to another worker or
// attempt.
std::string SignedBytes(const std::string& attempt, const AdvertisedKeys& keys);

// SHA-256 of the attempt, the worker and its seed: what phase 1 commits to and unmasking checks a rebuilt seed by.
Key32 SeedCommitment(const std::string& attempt, uint64_t worker, const Key32& seed);

// Phase 2: one worker's shares for one neighbor, sealed with AES-256-GCM under their pair's key.
struct SealedShare {
  uint64_t from = 0;
  uint64_t to = 0;
  std::string sealed;  // raw bytes
  bool operator==(const SealedShare&) const = default;
};

enum class SecretKind { kSeed, kMaskingKey };

// Phase 4: a share of a neighbor's self-mask seed (the neighbor sent its masked input) or of its masking key (it did
// not), never both for one neighbor.
struct RevealedShare {
  uint64_t owner = 0;
  SecretKind kind = SecretKind::kSeed;
  ShamirShare share;
  bool operator==(const RevealedShare&) const = default;
};

nlohmann::json ToJson(const RoundSetup& setup);
nlohmann::json ToJson(const AdvertisedKeys& keys);
nlohmann::json ToJson(const SealedShare& share);
nlohmann::json ToJson(const RevealedShare& share);
StatusOr<RoundSetup> ParseRoundSetup(const nlohmann::json& json);  // also CheckRoundSetup
StatusOr<AdvertisedKeys> ParseAdvertisedKeys(const nlohmann::json& json);
StatusOr<SealedShare> ParseSealedShare(const nlohmann::json& json);
StatusOr<RevealedShare> ParseRevealedShare(const nlohmann::json& json);
// dp_fedavg's noise, sent with the setup: {"clip_norm": > 0, "noise_stddev": >= 0}, both finite.
nlohmann::json ToJson(const DistributedNoise& noise);
StatusOr<DistributedNoise> ParseDistributedNoise(const nlohmann::json& json);

// Lists of messages as JSON arrays (what a route answers or a worker posts), and back: the first element that does not
// parse gives the error, and anything but an array is InvalidArgument.
nlohmann::json ToJson(std::span<const AdvertisedKeys> list);
nlohmann::json ToJson(std::span<const SealedShare> list);
nlohmann::json ToJson(std::span<const RevealedShare> list);
StatusOr<std::vector<AdvertisedKeys>> ParseAdvertisedKeysList(const nlohmann::json& json);
StatusOr<std::vector<SealedShare>> ParseSealedShareList(const nlohmann::json& json);
StatusOr<std::vector<RevealedShare>> ParseRevealedShareList(const nlohmann::json& json);

}  // namespace parsyn::secagg
