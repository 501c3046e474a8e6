#include "secagg/messages.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "base/strings.h"
#include "protocol/json_fields.h"

namespace parsyn::secagg {
namespace {

using nlohmann::json;
using protocol::JsonFields;

constexpr size_t kMaxSealedBytes = 4096;
constexpr size_t kMaxSignatureBytes = 1024;
constexpr size_t kMaxCertificateBytes = 16384;

std::string Hex(const Key32& key) { return HexEncode(std::span<const unsigned char>(key.data(), key.size())); }

std::optional<Key32> KeyField(JsonFields& fields, std::string_view name) {
  const std::optional<std::string> hex = fields.String(name, true, 64);
  if (!hex) return std::nullopt;
  StatusOr<Key32> key = weights::ParseSecretKey(*hex);
  if (!key.ok()) {
    fields.AddProblem(fields.Quoted(name) + " must be 64 hex digits (32 bytes)");
    return std::nullopt;
  }
  return *key;
}

// Raw bytes carried as hex, at most max_bytes of them (empty allowed when `allow_empty`).
std::optional<std::string> BytesField(JsonFields& fields, std::string_view name, size_t max_bytes, bool allow_empty) {
  const std::optional<std::string> hex = fields.String(name, true, 2 * max_bytes, allow_empty);
  if (!hex) return std::nullopt;
  std::optional<std::string> bytes = HexDecode(*hex);
  if (!bytes) fields.AddProblem(fields.Quoted(name) + " must be hex digits, two per byte");
  return bytes;
}

std::string KindName(SecretKind kind) { return kind == SecretKind::kSeed ? "seed" : "masking_key"; }

}  // namespace

std::string SignedBytes(const std::string& attempt, const AdvertisedKeys& keys) {
  return "parsyn secure aggregation keys v1\n" + attempt + "\n" + std::to_string(keys.worker) + "\n" +
         Hex(keys.sealing_key) + "\n" + Hex(keys.masking_key) + "\n" + Hex(keys.seed_commitment) + "\n";
}

Key32 SeedCommitment(const std::string& attempt, uint64_t worker, const Key32& seed) {
  const std::string digest =
      Sha256Hex("parsyn secure aggregation seed v1\n" + attempt + "\n" + std::to_string(worker) + "\n" + Hex(seed));
  return *weights::ParseSecretKey(digest);
}

json ToJson(const RoundSetup& setup) {
  return {{"attempt", setup.attempt},
          {"participants", setup.participants},
          {"threshold", setup.min_survivors},
          {"neighbors", setup.neighbors},
          {"share_threshold", setup.share_threshold},
          {"quantization_bits", setup.quantization_bits},
          {"ring_bits", setup.ring_bits},
          {"clipping_range", setup.clipping_range},
          {"vector_length", setup.vector_length},
          {"graph_seed", Hex(setup.graph_seed)}};
}

json ToJson(const AdvertisedKeys& keys) {
  json out = {{"worker", keys.worker},
              {"sealing_key", Hex(keys.sealing_key)},
              {"masking_key", Hex(keys.masking_key)},
              {"seed_commitment", Hex(keys.seed_commitment)},
              {"signature", HexEncode(keys.signature)}};
  if (!keys.certificate.empty()) out["certificate"] = keys.certificate;  // unsigned keys carry none
  return out;
}

json ToJson(const SealedShare& share) {
  return {{"from", share.from}, {"to", share.to}, {"sealed", HexEncode(share.sealed)}};
}

json ToJson(const RevealedShare& share) {
  return {{"owner", share.owner}, {"kind", KindName(share.kind)}, {"x", share.share.x}, {"y", share.share.y}};
}

json ToJson(const DistributedNoise& noise) {
  return {{"clip_norm", noise.clip_norm}, {"noise_stddev", noise.noise_stddev}};
}

StatusOr<DistributedNoise> ParseDistributedNoise(const json& value) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Strict(value, {"clip_norm", "noise_stddev"}));
  DistributedNoise noise;
  noise.clip_norm = fields.Number("clip_norm", true).value_or(0);
  noise.noise_stddev = fields.Number("noise_stddev", true).value_or(0);
  PARSYN_RETURN_IF_ERROR(fields.status());
  if (!(noise.clip_norm > 0) || !std::isfinite(noise.clip_norm)) {
    return InvalidArgumentError("distributed noise's clip_norm must be a finite number > 0");
  }
  if (!(noise.noise_stddev >= 0) || !std::isfinite(noise.noise_stddev)) {
    return InvalidArgumentError("distributed noise's noise_stddev must be a finite number >= 0");
  }
  return noise;
}

StatusOr<RoundSetup> ParseRoundSetup(const json& value) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Strict(value,
                                                                {"attempt", "participants", "threshold", "neighbors",
                                                                 "share_threshold", "quantization_bits", "ring_bits",
                                                                 "clipping_range", "vector_length", "graph_seed"},
                                                                "secure_aggregation."));
  RoundSetup setup;
  setup.attempt = fields.String("attempt", true, 200).value_or("");
  if (const std::optional<json> ids = fields.Array("participants", true, 65535)) {
    for (const json& id : *ids) {
      if (!id.is_number_unsigned()) {
        fields.AddProblem(fields.Quoted("participants") + " must hold worker ids");
        break;
      }
      setup.participants.push_back(id.get<uint64_t>());
    }
  }
  setup.min_survivors = static_cast<size_t>(fields.Int("threshold", true, 1, 65535).value_or(0));
  setup.neighbors = static_cast<size_t>(fields.Int("neighbors", true, 1, 65535).value_or(0));
  setup.share_threshold = static_cast<size_t>(fields.Int("share_threshold", true, 1, 65535).value_or(0));
  setup.quantization_bits = static_cast<int>(fields.Int("quantization_bits", true, 8, 16).value_or(0));
  setup.ring_bits = static_cast<int>(fields.Int("ring_bits", true, 16, 32).value_or(0));
  setup.clipping_range = fields.Number("clipping_range", true).value_or(0);
  setup.vector_length = static_cast<size_t>(fields.Int("vector_length", true, 2, int64_t{1} << 40).value_or(0));
  setup.graph_seed = KeyField(fields, "graph_seed").value_or(Key32{});
  PARSYN_RETURN_IF_ERROR(fields.status());
  PARSYN_RETURN_IF_ERROR(CheckRoundSetup(setup));
  return setup;
}

StatusOr<AdvertisedKeys> ParseAdvertisedKeys(const json& value) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields,
                          JsonFields::Strict(value, {"worker", "sealing_key", "masking_key", "seed_commitment",
                                                     "signature", "certificate"}));
  AdvertisedKeys keys;
  keys.worker = fields.Uint64("worker", true).value_or(0);
  keys.sealing_key = KeyField(fields, "sealing_key").value_or(Key32{});
  keys.masking_key = KeyField(fields, "masking_key").value_or(Key32{});
  keys.seed_commitment = KeyField(fields, "seed_commitment").value_or(Key32{});
  keys.signature = BytesField(fields, "signature", kMaxSignatureBytes, true).value_or("");
  keys.certificate = fields.Lines("certificate", false, kMaxCertificateBytes).value_or("");
  PARSYN_RETURN_IF_ERROR(fields.status());
  return keys;
}

StatusOr<SealedShare> ParseSealedShare(const json& value) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Strict(value, {"from", "to", "sealed"}));
  SealedShare share;
  share.from = fields.Uint64("from", true).value_or(0);
  share.to = fields.Uint64("to", true).value_or(0);
  share.sealed = BytesField(fields, "sealed", kMaxSealedBytes, false).value_or("");
  PARSYN_RETURN_IF_ERROR(fields.status());
  return share;
}

StatusOr<RevealedShare> ParseRevealedShare(const json& value) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Strict(value, {"owner", "kind", "x", "y"}));
  RevealedShare revealed;
  revealed.owner = fields.Uint64("owner", true).value_or(0);
  const std::string kind = fields.String("kind", true, 16).value_or("");
  if (kind == "masking_key") {
    revealed.kind = SecretKind::kMaskingKey;
  } else if (kind != "seed" && !kind.empty()) {
    fields.AddProblem(fields.Quoted("kind") + " must be \"seed\" or \"masking_key\"");
  }
  revealed.share.x = static_cast<uint32_t>(fields.Int("x", true, 1, 65535).value_or(0));
  if (const std::optional<json> y = fields.Array("y", true, ShamirChunks(kMaxSecretBytes))) {
    for (const json& element : *y) {
      if (!element.is_number_unsigned() || element.get<uint64_t>() >= kShamirPrime) {
        fields.AddProblem(fields.Quoted("y") + " must hold field elements (integers below 2^61 - 1)");
        break;
      }
      revealed.share.y.push_back(element.get<uint64_t>());
    }
  }
  PARSYN_RETURN_IF_ERROR(fields.status());
  return revealed;
}

namespace {

template <typename T>
json ListToJson(std::span<const T> list) {
  json out = json::array();
  for (const T& item : list) out.push_back(ToJson(item));
  return out;
}

template <typename T, typename Parse>
StatusOr<std::vector<T>> ParseList(const json& value, Parse parse) {
  if (!value.is_array()) return InvalidArgumentError(std::string("expected a JSON array, got ") + value.type_name());
  std::vector<T> out;
  for (const json& item : value) {
    PARSYN_ASSIGN_OR_RETURN(T parsed, parse(item));
    out.push_back(std::move(parsed));
  }
  return out;
}

}  // namespace

json ToJson(std::span<const AdvertisedKeys> list) { return ListToJson(list); }
json ToJson(std::span<const SealedShare> list) { return ListToJson(list); }
json ToJson(std::span<const RevealedShare> list) { return ListToJson(list); }
StatusOr<std::vector<AdvertisedKeys>> ParseAdvertisedKeysList(const json& value) {
  return ParseList<AdvertisedKeys>(value, ParseAdvertisedKeys);
}
StatusOr<std::vector<SealedShare>> ParseSealedShareList(const json& value) {
  return ParseList<SealedShare>(value, ParseSealedShare);
}
StatusOr<std::vector<RevealedShare>> ParseRevealedShareList(const json& value) {
  return ParseList<RevealedShare>(value, ParseRevealedShare);
}

}  // namespace parsyn::secagg
