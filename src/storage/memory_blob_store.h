// MemoryBlobStore: an in-memory BlobStore for unit tests of the layers above (coordinator, round engine).
//
// It passes the same contract suite as the directory store, and can be told to fail the next Put(s) so tests can
// check what happens when a round's global cannot be stored. Safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "storage/blob_store.h"

namespace parsyn::storage {

class MemoryBlobStore final : public BlobStore {
 public:
  StatusOr<BlobInfo> Put(std::string_view key, ByteSource& data, const PutOptions& options = {}) override;
  StatusOr<std::unique_ptr<ByteSource>> Get(std::string_view key) override;
  StatusOr<BlobInfo> Head(std::string_view key) override;
  // Always FailedPrecondition (after the NotFound check): there are no local files.
  StatusOr<std::filesystem::path> LocalPath(std::string_view key) override;
  Status Delete(std::string_view key) override;
  StatusOr<std::vector<std::string>> List(std::string_view prefix) override;

  // The next `count` Put() calls (with a valid key) return `error` and store nothing.
  void FailNextPuts(int count, Status error);
  // How many times Get() was called for `key` (found or not): lets a test see what was read.
  int64_t gets(std::string_view key);

 private:
  struct Blob {
    std::shared_ptr<const std::string> bytes;
    std::string sha256;
  };
  std::mutex mu_;
  std::map<std::string, Blob, std::less<>> blobs_;
  std::map<std::string, int64_t, std::less<>> gets_;
  int puts_to_fail_ = 0;
  Status put_error_;
};

}  // namespace parsyn::storage
