// LocalBlobCopy: a blob's bytes as a local file, for code that memory-maps or reads files (update checks,
// aggregation, dataset sharding) whatever the store.
//
// For a store with local files (the directory store) it is the store's own file, with the size and sha256 the store
// recorded while it wrote the blob (it computed them itself). For other stores (S3) the blob is streamed once into a
// temporary file under `spool_dir`, hashing as it goes, and the file is removed when the copy goes away; the size and
// sha256 are those of the bytes actually received, so a caller checking them checks what it will read, whatever the
// store's metadata says. A mapping of the file stays valid after the copy is gone (POSIX keeps unlinked mapped files).
//
// Memory stays bounded (one 1 MiB buffer) whatever the blob's size. Blocking; safe from any thread (one object per
// thread).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "storage/blob_store.h"

namespace parsyn::storage {

class LocalBlobCopy {
 public:
  // NotFound if no blob has `key`; ResourceExhausted (nothing kept) once the blob passes `max_bytes`; Unavailable
  // for store or disk errors, naming the key. `spool_dir` is created if missing.
  static StatusOr<LocalBlobCopy> Open(BlobStore& blobs, std::string_view key, const std::filesystem::path& spool_dir,
                                      std::optional<uint64_t> max_bytes = std::nullopt);
  ~LocalBlobCopy();
  LocalBlobCopy(LocalBlobCopy&& other) noexcept;
  LocalBlobCopy& operator=(LocalBlobCopy&& other) noexcept;
  LocalBlobCopy(const LocalBlobCopy&) = delete;
  LocalBlobCopy& operator=(const LocalBlobCopy&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& sha256() const { return sha256_; }
  // True when path() is a temporary download (removed with this object).
  bool downloaded() const { return remove_on_destroy_; }

 private:
  LocalBlobCopy() = default;
  std::filesystem::path path_;
  uint64_t size_bytes_ = 0;
  std::string sha256_;
  bool remove_on_destroy_ = false;
};

}  // namespace parsyn::storage
