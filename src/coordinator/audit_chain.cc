#include "coordinator/audit_chain.h"

#include <optional>
#include <set>

#include "base/clock.h"
#include "base/sha256.h"
#include "base/strings.h"

namespace parsyn::coordinator {

using nlohmann::json;

namespace {

// `record` as it is hashed and stored: its text re-read, so a string that was not valid UTF-8 (a request path may
// hold any bytes) carries U+FFFD from here on, in the hash and in every copy alike.
json Normalised(const json& record) { return json::parse(record.dump(-1, ' ', false, json::error_handler_t::replace)); }

json WithHash(json record) {
  record = Normalised(record);
  record["hash"] = AuditRecordHash(record);
  return record;
}

std::string Where(int64_t seq, size_t line) {
  return "record " + std::to_string(seq) + " (line " + std::to_string(line) + ")";
}

// The checkpoint member's fields, or nullopt when one is missing or of the wrong type.
struct Checkpoint {
  int64_t seq = 0;
  std::string hash;
  std::string key_id;
  std::string signature;
};
std::optional<Checkpoint> ReadCheckpoint(const json& record) {
  const auto it = record.find("checkpoint");
  if (it == record.end() || !it->is_object()) return std::nullopt;
  const json& c = *it;
  if (!c.contains("seq") || !c["seq"].is_number_integer()) return std::nullopt;
  for (const char* field : {"hash", "key_id", "signature"}) {
    if (!c.contains(field) || !c[field].is_string()) return std::nullopt;
  }
  return Checkpoint{c["seq"].get<int64_t>(), c["hash"].get<std::string>(), c["key_id"].get<std::string>(),
                    c["signature"].get<std::string>()};
}

// A checkpoint's signature checked against the key it names. `head` is the record before it in the file (none when
// the file starts with the checkpoint: the signature is then checked alone).
Status CheckCheckpoint(const json& record, int64_t seq, size_t line,
                       const std::optional<std::pair<int64_t, std::string>>& head,
                       std::span<const Ed25519PublicKey> keys) {
  std::optional<Checkpoint> c = ReadCheckpoint(record);
  if (!c) return DataLossError(Where(seq, line) + " is a checkpoint without its seq, hash, key_id and signature");
  if (head && (c->seq != head->first || c->hash != head->second)) {
    return DataLossError("checkpoint " + Where(seq, line) + " signs record " + std::to_string(c->seq) + " as " +
                         c->hash.substr(0, 12) + "..., but the chain has record " + std::to_string(head->first) +
                         " as " + head->second.substr(0, 12) +
                         "...: a record before it was changed and the chain "
                         "rewritten");
  }
  const Ed25519PublicKey* key = nullptr;
  for (const Ed25519PublicKey& k : keys) {
    if (Ed25519KeyId(k) == c->key_id) key = &k;
  }
  if (key == nullptr) {
    return DataLossError("checkpoint " + Where(seq, line) + " is signed by key " + c->key_id +
                         ", which no --key gives: pass the public key of the coordinator that wrote it "
                         "(GET /api/v1/audit/key on that coordinator)");
  }
  const std::optional<std::string> signature = HexDecode(c->signature);
  if (!signature || !key->Verify(AuditCheckpointMessage(c->seq, c->hash), *signature)) {
    return DataLossError("checkpoint " + Where(seq, line) + " is forged: its signature does not verify with key " +
                         c->key_id);
  }
  return Status::Ok();
}

}  // namespace

std::string AuditOutcome(int http_status) {
  if (http_status == 401 || http_status == 403) return "denied";
  return http_status < 400 ? "success" : "failure";
}

json ChainAuditRecord(const AuditEntry& entry, int64_t seq, std::string_view prev_hash) {
  std::string detail = entry.detail.substr(0, kAuditDetailChars);
  json record = {{"seq", seq},
                 {"time", Rfc3339Millis(entry.time_ms)},
                 {"actor", entry.actor},
                 {"action", entry.action},
                 {"object", entry.object},
                 {"outcome", entry.outcome},
                 {"status", entry.status},
                 {"detail", std::move(detail)},
                 {"source", entry.source},
                 {"request_id", entry.request_id},
                 {"prev_hash", std::string(prev_hash)}};
  if (!entry.project.empty()) record["project"] = entry.project;
  return WithHash(std::move(record));
}

json ChainAuditCheckpoint(int64_t seq, int64_t time_ms, std::string_view actor, int64_t head_seq,
                          std::string_view head_hash, const Ed25519PrivateKey& key) {
  const Ed25519PublicKey pub = Ed25519PublicKey::FromPem(key.PublicPem()).value();
  json record = {{"seq", seq},
                 {"time", Rfc3339Millis(time_ms)},
                 {"actor", std::string(actor)},
                 {"action", std::string(kAuditCheckpointAction)},
                 {"object", "record " + std::to_string(head_seq)},
                 {"outcome", "success"},
                 {"status", 0},
                 {"detail", ""},
                 {"source", ""},
                 {"request_id", ""},
                 {"prev_hash", std::string(head_hash)},
                 {"checkpoint",
                  {{"seq", head_seq},
                   {"hash", std::string(head_hash)},
                   {"key_id", Ed25519KeyId(pub)},
                   {"signature", HexEncode(key.Sign(AuditCheckpointMessage(head_seq, head_hash)))}}}};
  return WithHash(std::move(record));
}

std::string AuditRecordHash(const json& record) {
  json content = record;
  content.erase("hash");
  return Sha256Hex(content.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string AuditCheckpointMessage(int64_t seq, std::string_view hash) {
  return "parsyn audit checkpoint\n" + std::to_string(seq) + "\n" + std::string(hash);
}

StatusOr<AuditVerification> VerifyAuditLines(std::span<const std::string> lines,
                                             std::span<const Ed25519PublicKey> keys) {
  if (keys.empty()) return InvalidArgumentError("no public key to check the checkpoints with: pass --key FILE");
  // Parsed first: a jump in the seqs is a reorder when the missing records come later in the file.
  std::vector<std::pair<size_t, json>> records;
  std::set<int64_t> seqs;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r\n") == std::string::npos) continue;
    json record = json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    const bool is_record = record.is_object() && record.contains("seq") && record["seq"].is_number_integer() &&
                           record.contains("prev_hash") && record["prev_hash"].is_string() && record.contains("hash") &&
                           record["hash"].is_string();
    if (!is_record) {
      return InvalidArgumentError("line " + std::to_string(i + 1) +
                                  " is not an audit record (a JSON object with seq, prev_hash and hash): export the "
                                  "log with `parsyn audit export`");
    }
    seqs.insert(record["seq"].get<int64_t>());
    records.emplace_back(i + 1, std::move(record));
  }
  if (records.empty()) return InvalidArgumentError("the file holds no audit record");

  AuditVerification result;
  std::optional<std::pair<int64_t, std::string>> previous;  // seq and hash of the record before
  for (const auto& [line, record] : records) {
    const int64_t seq = record["seq"].get<int64_t>();
    const std::string hash = record["hash"].get<std::string>();
    if (previous && seq <= previous->first) {
      return DataLossError(Where(seq, line) + " comes after record " + std::to_string(previous->first) +
                           ": the records were reordered");
    }
    if (previous && seq > previous->first + 1) {
      const int64_t missing = previous->first + 1;
      if (seqs.count(missing) != 0) {
        return DataLossError(Where(seq, line) + " comes before record " + std::to_string(missing) +
                             ": the records were reordered");
      }
      return DataLossError(
          "record " + std::to_string(missing) + (seq - 1 > missing ? " to " + std::to_string(seq - 1) : std::string()) +
          " deleted: the file goes from record " + std::to_string(previous->first) + " to " + Where(seq, line));
    }
    if (AuditRecordHash(record) != hash) {
      return DataLossError(Where(seq, line) + " was edited: its content does not match its hash");
    }
    const std::string prev_hash = record["prev_hash"].get<std::string>();
    if (!previous && seq == 1 && prev_hash != kAuditGenesisHash) {
      return DataLossError(Where(seq, line) + " is the first record but does not start the chain (prev_hash)");
    }
    if (previous && prev_hash != previous->second) {
      return DataLossError(Where(seq, line) + "'s prev_hash is not the hash of record " +
                           std::to_string(previous->first) + ": record " + std::to_string(previous->first) +
                           " was changed (and its hash recomputed), or a record between them replaced");
    }
    if (record.value("action", "") == kAuditCheckpointAction) {
      PARSYN_RETURN_IF_ERROR(CheckCheckpoint(record, seq, line, previous, keys));
      ++result.checkpoints;
      result.last_checkpoint_seq = seq;
    }
    if (!previous) result.first_seq = seq;
    result.last_seq = seq;
    ++result.records;
    previous.emplace(seq, hash);
  }
  result.unsigned_tail = result.last_seq - std::max(result.last_checkpoint_seq, result.first_seq - 1);
  return result;
}

}  // namespace parsyn::coordinator
