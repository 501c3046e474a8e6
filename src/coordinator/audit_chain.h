// The audit log's records and their chain (docs/operations.md, "Audit log"), shared by the coordinator, which writes
// them (AuditLog), and `parsyn audit verify`, which checks an exported file offline.
//
// A record is one JSON object: {"seq", "time", "actor", "action", "object", "outcome", "status", "detail", "source",
// "request_id", "prev_hash", "hash"}. "hash" is the SHA-256 of the record's canonical text without "hash" (its keys
// sorted, no spaces: nlohmann::json::dump()), and "prev_hash" the hash of the record before it (64 zeros for record 1),
// so changing, removing or reordering a record breaks the chain from there on. A checkpoint is a record of its own
// (action "audit.checkpoint") whose "checkpoint" member holds the Ed25519 signature of the record before it:
// {"seq", "hash", "key_id", "signature" (hex)} over CheckpointMessage(seq, hash). Whoever rewrites the chain from an
// edited record on cannot sign the checkpoints after it again without the coordinator's private key.
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/ed25519.h"
#include "base/status.h"

namespace parsyn::coordinator {

inline constexpr std::string_view kAuditGenesisHash =
    "0000000000000000000000000000000000000000000000000000000000000000";
inline constexpr std::string_view kAuditCheckpointAction = "audit.checkpoint";

// What happened, before the log gives it its place in the chain.
struct AuditEntry {
  int64_t time_ms = 0;
  std::string actor;       // "admin", "worker 7", "anonymous" (a request whose credential was refused)
  std::string action;      // "<METHOD> <route pattern>": "POST /api/v1/training-jobs/{id}/cancel"
  std::string object;      // what it acted on: the created resource's path, else the request's path
  std::string outcome;     // "success" (2xx, 3xx), "denied" (401, 403), "failure" (any other)
  int status = 0;          // the HTTP status answered
  std::string detail;      // a failure's or denial's message, at most kAuditDetailChars characters
  std::string source;      // the client's address: "203.0.113.9:53122"
  std::string request_id;  // the X-Request-Id answered
  // The project the request acted in (its name; the record has "project" only when set) and its id (stored beside
  // the record, for the project owners' view); "" and 0 for requests outside any project.
  std::string project;
  int64_t project_id = 0;
};
inline constexpr size_t kAuditDetailChars = 200;

// "success", "denied" or "failure" for an HTTP status, as AuditEntry::outcome says.
std::string AuditOutcome(int http_status);

// The record of `entry` at `seq` after a record whose hash is `prev_hash`, with its "hash".
nlohmann::json ChainAuditRecord(const AuditEntry& entry, int64_t seq, std::string_view prev_hash);
// A checkpoint at `seq` (after the record `head_seq` with hash `head_hash`, which it signs with `key`).
nlohmann::json ChainAuditCheckpoint(int64_t seq, int64_t time_ms, std::string_view actor, int64_t head_seq,
                                    std::string_view head_hash, const Ed25519PrivateKey& key);
// The SHA-256 (hex) of `record`'s canonical text without its "hash" member.
std::string AuditRecordHash(const nlohmann::json& record);
// The bytes a checkpoint signs: "parsyn audit checkpoint\n<seq>\n<hash>".
std::string AuditCheckpointMessage(int64_t seq, std::string_view hash);

// What VerifyAuditLines found in a chain that holds.
struct AuditVerification {
  int64_t first_seq = 0;
  int64_t last_seq = 0;
  int64_t records = 0;
  int64_t checkpoints = 0;          // checkpoints whose signature verified
  int64_t last_checkpoint_seq = 0;  // 0: none
  int64_t unsigned_tail = 0;        // records after the last checkpoint (no signature covers them yet)
};

// Checks exported records (one JSON object a line, in seq order; blank lines are skipped) against `keys`: every
// record's hash, every link to the record before, consecutive seqs, and every checkpoint's signature by one of the
// keys. A file that starts after record 1 is checked from its first record on. DataLoss naming the first broken
// record and what is wrong with it: edited ("its content does not match its hash"), deleted or reordered (the seqs
// jump or go back), changed before it ("its prev_hash is not the hash of record N"), a forged checkpoint (its
// signature does not verify) or one by a key not given. InvalidArgument when a line is not a record or no key is given.
StatusOr<AuditVerification> VerifyAuditLines(std::span<const std::string> lines,
                                             std::span<const Ed25519PublicKey> keys);

}  // namespace parsyn::coordinator
