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
//
// Spares: Recycle() renames the blobs' files to temp names in the root ("spare#tmp-<pid>-<n>") instead of unlinking
// them, and a Put with durable = false writes over a spare (then truncates it to its size) instead of a new file: its
// pages are in memory already. A spare is unlinked once its file is older than Options::spare_max_age (it is never kept
// dirty long enough for the kernel's 30 s writeback to write it to disk), when the spares would pass
// Options::max_spare_bytes, and when the store closes; one left by a crash is swept by Open() as a temp file.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>

#include "storage/blob_store.h"

namespace parsyn::storage {

class DirectoryBlobStore final : public BlobStore {
 public:
  struct Options {
    // A spare is reused only while its file is younger than this (its first bytes were written then), so no page of
    // it stays dirty for the 30 s after which the kernel writes dirty pages back.
    std::chrono::milliseconds spare_max_age{20'000};
    // The bytes all spares may hold (page cache, dirty): one round of 1,000 x 2 MiB or 100 x 20 MiB updates.
    uint64_t max_spare_bytes = uint64_t{2} << 30;
  };

  // Creates `root` if missing and sweeps stale temp files under it. Unavailable if it cannot be created or read.
  static StatusOr<std::unique_ptr<DirectoryBlobStore>> Open(const std::filesystem::path& root);
  static StatusOr<std::unique_ptr<DirectoryBlobStore>> Open(const std::filesystem::path& root, Options options);
  ~DirectoryBlobStore() override;

  StatusOr<BlobInfo> Put(std::string_view key, ByteSource& data, const PutOptions& options = {}) override;
  StatusOr<std::unique_ptr<ByteSource>> Get(std::string_view key) override;
  StatusOr<BlobInfo> Head(std::string_view key) override;
  StatusOr<std::filesystem::path> LocalPath(std::string_view key) override;
  Status Delete(std::string_view key) override;
  Status DeleteAll(std::span<const std::string> keys) override;
  Status Recycle(std::span<const std::string> keys) override;
  StatusOr<std::vector<std::string>> List(std::string_view prefix) override;
  Status SyncAll() override;

  const std::filesystem::path& root() const { return root_; }
  // How many directory entries on keys' paths durable Puts have fsynced so far (their parents' fsyncs; for tests).
  uint64_t path_entry_syncs() const { return path_entry_syncs_.load(); }
  // Spares kept now, and Puts that wrote over one so far (for tests).
  size_t spares() const;
  uint64_t spares_reused() const { return spares_reused_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Spare {
    std::filesystem::path path;
    uint64_t size_bytes;
  };

  DirectoryBlobStore(std::filesystem::path root, Options options)
      : root_(std::move(root)), options_(std::move(options)) {}
  // The youngest of the few youngest spares that is no larger than `size_hint` bytes, taken out of the list (nullopt:
  // none, or no hint).
  std::optional<Spare> TakeSpare(std::optional<uint64_t> size_hint);
  // Unlinks the spares that have expired; spares_mu_ held.
  void DropExpiredSpares(Clock::time_point now);
  // Unlinks spares as they expire; sleeps while there are none (started by the first Recycle, stopped by the
  // destructor).
  void SweepSpares(std::stop_token stop);
  // Opens the file a Put of `final_path` writes into: `spare` if there is one and it opens, else an unnamed file in
  // its directory (O_TMPFILE), else (no O_TMPFILE there) a named temp file. Returns the descriptor (-1 with errno
  // set) and the file's name (empty: unnamed).
  std::pair<int, std::filesystem::path> OpenBlobFile(const std::optional<Spare>& spare,
                                                     const std::filesystem::path& final_path,
                                                     const std::string& temp_suffix);
  // Creates the directories of `relative` (a key's parent) under the root; `durable`: and makes their entries durable.
  Status EnsureKeyDirs(const std::filesystem::path& relative, bool durable);

  std::filesystem::path root_;
  // Directories under root_ whose entry in their parent this store has fsynced: a durable Put into them need not
  // fsync their parents again (a round's directory is synced by its global's Put; its job's, once).
  std::mutex synced_dirs_mu_;
  std::unordered_set<std::string> synced_dirs_;
  std::atomic<uint64_t> path_entry_syncs_{0};

  const Options options_;
  mutable std::mutex spares_mu_;
  std::condition_variable_any spares_changed_;
  std::multimap<Clock::time_point, Spare> spares_;  // by when each expires: its file's birth + spare_max_age
  uint64_t spare_bytes_ = 0;
  std::atomic<uint64_t> spares_reused_{0};
  std::jthread sweeper_;  // last: stopped and joined before the spares it sweeps are gone
};

}  // namespace parsyn::storage
