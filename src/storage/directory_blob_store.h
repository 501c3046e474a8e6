// DirectoryBlobStore: blobs as files under a root directory (the default store; `file://` URIs).
//
// Layout: the blob for key "a/b/c" is the file <root>/a/b/c, its sha256 in the file's extended attribute
// "user.parsyn.sha256" (set before the file gets its name; a cache, recomputed when missing or damaged). Where the
// file system has no user extended attributes, a sidecar file "c#sha256" beside it holds the sha256 instead. Put
// writes and fsyncs an unnamed file (O_TMPFILE; where the file system has none, a temp file "c#tmp-<unique>" that
// exists only while the Put is in flight), hard-links it to the final name (atomic and create-only: linkat() fails if
// the name is taken), then fsyncs the directory; readers therefore see either no blob or the whole blob. '#' cannot
// appear in a key, so sidecars and temp names never collide with blobs. A sidecar is never fsynced (after a crash it
// may be empty; Head then hashes the blob again). A durable Put makes every directory entry on its path durable: each
// directory's parent is fsynced once per store (remembered here), and again whenever Put creates the directory. A Put
// with PutOptions::durable false skips the fsyncs of the file, of the directory and of the directories on its path.
// Temp files left by a crash are removed when the store is opened. Unlike object stores, a key cannot also be a
// directory of another key: with blob "a/b" stored, Put("a/b/c") is FailedPrecondition, and Put("a") is AlreadyExists.
// Coordinator keys never nest that way. Safe to call from several threads at once; all coordination is through the file
// system. Open() sweeps temp files, so only one process should have a given root open at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "storage/blob_store.h"

namespace parsyn::storage {

class DirectoryBlobStore final : public BlobStore {
 public:
  // Creates `root` if missing and sweeps stale temp files under it. Unavailable if it cannot be created or read.
  static StatusOr<std::unique_ptr<DirectoryBlobStore>> Open(const std::filesystem::path& root);

  StatusOr<BlobInfo> Put(std::string_view key, ByteSource& data, const PutOptions& options = {}) override;
  StatusOr<std::unique_ptr<ByteSource>> Get(std::string_view key) override;
  StatusOr<BlobInfo> Head(std::string_view key) override;
  StatusOr<std::filesystem::path> LocalPath(std::string_view key) override;
  Status Delete(std::string_view key) override;
  Status DeleteAll(std::span<const std::string> keys) override;
  StatusOr<std::vector<std::string>> List(std::string_view prefix) override;
  Status SyncAll() override;

  const std::filesystem::path& root() const { return root_; }
  // How many directory entries on keys' paths durable Puts have fsynced so far (their parents' fsyncs; for tests).
  uint64_t path_entry_syncs() const { return path_entry_syncs_.load(); }

 private:
  explicit DirectoryBlobStore(std::filesystem::path root) : root_(std::move(root)) {}
  // Creates the directories of `relative` (a key's parent) under the root; `durable`: and makes their entries durable.
  Status EnsureKeyDirs(const std::filesystem::path& relative, bool durable);

  std::filesystem::path root_;
  // Directories under root_ whose entry in their parent this store has fsynced: a durable Put into them need not
  // fsync their parents again (a round's directory is synced by its global's Put; its job's, once).
  std::mutex synced_dirs_mu_;
  std::unordered_set<std::string> synced_dirs_;
  std::atomic<uint64_t> path_entry_syncs_{0};
};

}  // namespace parsyn::storage
