// AuditLog: the coordinator's audit log (docs/operations.md, "Audit log"). Route handlers hand it what happened
// (AuditEntry); it chains each record onto the last (audit_chain.h), stores it in the metadata store, and every
// `checkpoint_every` records, and when asked at shutdown, adds a checkpoint signed with the coordinator's Ed25519 key.
//
// Records are chained where they are written, one batch at a time under a LoopMutex: entries that arrive while a
// batch is being written go into the next one (group commit), and the chain's head only moves once a batch is
// stored. A write that fails keeps its entries for the next one; one that finds its seqs taken (another coordinator
// continued the chain) reads the head again and chains them after it. The head is read from the store when this
// coordinator becomes the leader (ReloadHead), so a new leader continues the chain its predecessor left.
//
// Loop thread only, but for the key's accessors and LoadAuditSigningKey.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>

#include "base/clock.h"
#include "base/ed25519.h"
#include "base/status.h"
#include "coordinator/audit_chain.h"
#include "http/server.h"
#include "loop/loop_tools.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// The coordinator's signing key: `file` when given (`parsyn server --audit-key-file`, e.g. one key shared by every
// coordinator of a failover group), else <data_dir>/audit-signing-key.pem, created (0600) on the first start.
// InvalidArgument naming the file when it holds no Ed25519 private key; Unavailable on file errors. Blocking.
StatusOr<Ed25519PrivateKey> LoadAuditSigningKey(const std::filesystem::path& file,
                                                const std::filesystem::path& data_dir);

class AuditLog {
 public:
  // `actor` names this coordinator in its checkpoints ("coordinator <id>").
  AuditLog(storage::MetadataStore& store, boost::asio::thread_pool& pool, boost::asio::any_io_executor executor,
           const Clock& clock, Ed25519PrivateKey key, std::string actor, int64_t checkpoint_every);

  // Reads the chain's head from the store (its last record and last checkpoint). Blocking: at start-up.
  Status LoadHead() { return ReadHead(); }
  // LoadHead on the pool, once a batch being written is done: when this coordinator becomes the leader.
  http::Awaitable<Status> ReloadHead();
  // Chains `entry` (timed now unless it has a time) and waits until it is stored, with every entry before it. A failure
  // to store is logged, not returned: what the record tells of has happened already; the entry stays queued for the
  // next write.
  http::Awaitable<void> Append(AuditEntry entry);
  // Append without waiting: for a credential refused before its route's handler ran (the server answers it).
  void Post(AuditEntry entry);
  // Signs the chain's head now unless its last record is a checkpoint (at shutdown, while still the leader).
  http::Awaitable<void> Checkpoint();

  std::string public_key_pem() const { return public_pem_; }
  std::string key_id() const { return key_id_; }

 private:
  // Chains the queued entries (with the checkpoints due) onto the head and stores them; the head moves on success.
  // Under write_mutex_.
  http::Awaitable<Status> WritePending(bool checkpoint_now);
  // The store's head: last seq and hash, last checkpoint's seq. Blocking (on the pool).
  Status ReadHead();

  storage::MetadataStore& store_;
  boost::asio::thread_pool& pool_;
  boost::asio::any_io_executor executor_;
  const Clock& clock_;
  Ed25519PrivateKey key_;
  std::string public_pem_;
  std::string key_id_;
  std::string actor_;
  int64_t checkpoint_every_;

  loop::LoopMutex write_mutex_;
  std::deque<AuditEntry> pending_;  // appended, not yet stored
  int64_t entries_appended_ = 0;    // every entry ever appended: Append's ticket
  int64_t entries_stored_ = 0;      // of which stored (or given up)
  // The chain's head as stored (read by ReadHead on the pool, with write_mutex_ held; else loop only).
  int64_t head_seq_ = 0;
  std::string head_hash_{kAuditGenesisHash};
  int64_t last_checkpoint_seq_ = 0;
};

}  // namespace parsyn::coordinator
