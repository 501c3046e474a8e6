#include "coordinator/audit_log.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <vector>

#include "base/log.h"
#include "base/text_file.h"

namespace parsyn::coordinator {

using nlohmann::json;

namespace {

// Entries kept while the store refuses them; past this the oldest are dropped (and said so in the log) rather than
// grow without bound while the store is down.
constexpr size_t kMaxPendingEntries = 100'000;

storage::AuditRecord StoredRecord(const json& record, int64_t time_ms, int64_t project_id) {
  return storage::AuditRecord{.seq = record["seq"].get<int64_t>(),
                              .time_ms = time_ms,
                              .actor = record["actor"].get<std::string>(),
                              .action = record["action"].get<std::string>(),
                              .outcome = record["outcome"].get<std::string>(),
                              .record_json = record.dump(),
                              .project_id = project_id};
}

}  // namespace

StatusOr<Ed25519PrivateKey> LoadAuditSigningKey(const std::filesystem::path& file,
                                                const std::filesystem::path& data_dir) {
  const std::filesystem::path path = file.empty() ? data_dir / "audit-signing-key.pem" : file;
  std::error_code ec;
  if (file.empty() && !std::filesystem::exists(path, ec)) {
    PARSYN_ASSIGN_OR_RETURN(Ed25519PrivateKey made, Ed25519PrivateKey::Generate());
    Status written = WriteNewSecretFile(path, made.PrivatePem());
    if (!written.ok() && written.code() != StatusCode::kAlreadyExists) return written;
  }
  PARSYN_ASSIGN_OR_RETURN(const std::string pem, ReadWholeFile(path));
  StatusOr<Ed25519PrivateKey> key = Ed25519PrivateKey::FromPem(pem);
  if (!key.ok()) {
    return InvalidArgumentError(path.string() + ": " + key.status().message() +
                                "; make one with `openssl genpkey -algorithm ed25519 -out " + path.string() + "`");
  }
  return key;
}

AuditLog::AuditLog(storage::MetadataStore& store, boost::asio::thread_pool& pool, boost::asio::any_io_executor executor,
                   const Clock& clock, Ed25519PrivateKey key, std::string actor, int64_t checkpoint_every)
    : store_(store),
      pool_(pool),
      executor_(executor),
      clock_(clock),
      key_(std::move(key)),
      public_pem_(key_.PublicPem()),
      actor_(std::move(actor)),
      checkpoint_every_(std::max<int64_t>(checkpoint_every, 1)),
      write_mutex_(std::move(executor)) {
  key_id_ = Ed25519KeyId(Ed25519PublicKey::FromPem(public_pem_).value());
}

Status AuditLog::ReadHead() {
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::AuditRecord> last,
                          store_.ListAuditRecords({.newest_first = true, .limit = 1}));
  PARSYN_ASSIGN_OR_RETURN(
      std::vector<storage::AuditRecord> checkpoint,
      store_.ListAuditRecords({.action = std::string(kAuditCheckpointAction), .newest_first = true, .limit = 1}));
  if (last.empty()) {
    head_seq_ = 0;
    head_hash_ = kAuditGenesisHash;
  } else {
    const json record = json::parse(last[0].record_json, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("hash") || !record["hash"].is_string()) {
      return DataLossError("the audit log's last record (" + std::to_string(last[0].seq) +
                           ") is not a record: check the store's audit_records table");
    }
    head_seq_ = last[0].seq;
    head_hash_ = record["hash"].get<std::string>();
  }
  last_checkpoint_seq_ = checkpoint.empty() ? 0 : checkpoint[0].seq;
  return Status::Ok();
}

http::Awaitable<Status> AuditLog::ReloadHead() {
  co_await write_mutex_.Lock();
  loop::LoopLock lock(write_mutex_);
  auto read = loop::Offload(pool_, [this] { return ReadHead(); });  // kCoAwaitTemporaries
  co_return co_await std::move(read);
}

http::Awaitable<Status> AuditLog::WritePending(bool checkpoint_now) {
  const size_t taken = pending_.size();
  std::vector<storage::AuditRecord> batch;
  int64_t seq = head_seq_;
  std::string hash = head_hash_;
  int64_t last_checkpoint = last_checkpoint_seq_;
  const int64_t now = clock_.UnixMillis();
  auto add = [&](const json& record, int64_t time_ms, int64_t project_id = 0) {
    batch.push_back(StoredRecord(record, time_ms, project_id));
    seq = record["seq"].get<int64_t>();
    hash = record["hash"].get<std::string>();
  };
  auto add_checkpoint = [&] {
    add(ChainAuditCheckpoint(seq + 1, now, actor_, seq, hash, key_), now);
    last_checkpoint = seq;
  };
  for (size_t i = 0; i < taken; ++i) {
    add(ChainAuditRecord(pending_[i], seq + 1, hash), pending_[i].time_ms, pending_[i].project_id);
    if (seq - last_checkpoint >= checkpoint_every_) add_checkpoint();
  }
  if (checkpoint_now && seq > 0 && seq != last_checkpoint) add_checkpoint();
  if (batch.empty()) co_return Status::Ok();
  auto write = loop::Offload(pool_, [this, &batch] { return store_.AppendAuditRecords(batch); });
  Status stored = co_await std::move(write);
  if (!stored.ok()) co_return stored;
  head_seq_ = seq;
  head_hash_ = hash;
  last_checkpoint_seq_ = last_checkpoint;
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(taken));
  entries_stored_ += static_cast<int64_t>(taken);
  co_return Status::Ok();
}

http::Awaitable<void> AuditLog::Append(AuditEntry entry) {
  const int64_t ticket = ++entries_appended_;
  if (entry.time_ms == 0) entry.time_ms = clock_.UnixMillis();  // when it was answered
  pending_.push_back(std::move(entry));
  co_await write_mutex_.Lock();
  loop::LoopLock lock(write_mutex_);
  if (entries_stored_ >= ticket) co_return;  // a batch written meanwhile held it
  Status stored = co_await WritePending(/*checkpoint_now=*/false);
  if (stored.code() == StatusCode::kAlreadyExists) {
    // Another coordinator continued the chain: chain after its head.
    auto read = loop::Offload(pool_, [this] { return ReadHead(); });
    stored = co_await std::move(read);
    if (stored.ok()) stored = co_await WritePending(/*checkpoint_now=*/false);
  }
  if (!stored.ok()) {
    PARSYN_LOG_WARN("audit log: {} record(s) not stored yet, kept for the next write: {}", pending_.size(),
                    stored.ToString());
  }
  if (pending_.size() > kMaxPendingEntries) {
    const size_t dropped = pending_.size() - kMaxPendingEntries;
    PARSYN_LOG_ERROR("audit log: the store has refused records for a while; dropping the {} oldest unstored", dropped);
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(dropped));
    entries_stored_ += static_cast<int64_t>(dropped);
  }
}

void AuditLog::Post(AuditEntry entry) {
  boost::asio::co_spawn(executor_, Append(std::move(entry)), boost::asio::detached);
}

http::Awaitable<void> AuditLog::Checkpoint() {
  co_await write_mutex_.Lock();
  loop::LoopLock lock(write_mutex_);
  Status stored = co_await WritePending(/*checkpoint_now=*/true);
  if (!stored.ok()) PARSYN_LOG_WARN("audit log: could not sign the chain's head: {}", stored.ToString());
}

}  // namespace parsyn::coordinator
