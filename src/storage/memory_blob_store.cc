#include "storage/memory_blob_store.h"

#include <cstring>

#include "base/sha256.h"

namespace parsyn::storage {
namespace {

// Reads a shared, immutable copy of the blob, so a Delete() while reading leaves the reader's bytes intact.
class SharedStringSource final : public ByteSource {
 public:
  explicit SharedStringSource(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}
  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    size_t n = std::min(buffer.size(), bytes_->size() - offset_);
    std::memcpy(buffer.data(), bytes_->data() + offset_, n);
    offset_ += n;
    return n;
  }

 private:
  std::shared_ptr<const std::string> bytes_;
  size_t offset_ = 0;
};

Status NotFound(std::string_view key) { return NotFoundError("blob '" + std::string(key) + "' not found"); }

}  // namespace

StatusOr<BlobInfo> MemoryBlobStore::Put(std::string_view key, ByteSource& data, const PutOptions& options) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  {
    std::lock_guard lock(mu_);
    if (puts_to_fail_ > 0) {
      --puts_to_fail_;
      return put_error_;
    }
    if (blobs_.contains(key)) return AlreadyExistsError("blob '" + std::string(key) + "' already exists");
  }
  // Read outside the lock: the source may be slow (a network body).
  auto bytes = std::make_shared<std::string>();
  Sha256 hasher;
  std::byte chunk[64 * 1024];
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(size_t n, data.Read(chunk));
    if (n == 0) break;
    if (options.max_size_bytes && bytes->size() + n > *options.max_size_bytes) {
      return ResourceExhaustedError("blob '" + std::string(key) + "' is larger than the limit of " +
                                    std::to_string(*options.max_size_bytes) + " bytes");
    }
    bytes->append(reinterpret_cast<const char*>(chunk), n);
    hasher.Update(std::span<const std::byte>(chunk, n));
    if (options.observe_chunk) PARSYN_RETURN_IF_ERROR(options.observe_chunk(std::span<const std::byte>(chunk, n)));
  }
  BlobInfo info{std::string(key), bytes->size(), hasher.HexDigest()};
  if (options.expected_sha256 && *options.expected_sha256 != info.sha256) {
    return DataLossError("blob '" + std::string(key) + "' has sha256 " + info.sha256 + ", expected " +
                         *options.expected_sha256);
  }
  std::lock_guard lock(mu_);
  auto [it, inserted] = blobs_.try_emplace(std::string(key), Blob{std::move(bytes), info.sha256});
  if (!inserted) return AlreadyExistsError("blob '" + std::string(key) + "' already exists");
  return info;
}

StatusOr<std::unique_ptr<ByteSource>> MemoryBlobStore::Get(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::lock_guard lock(mu_);
  ++gets_[std::string(key)];
  auto it = blobs_.find(key);
  if (it == blobs_.end()) return NotFound(key);
  return std::unique_ptr<ByteSource>(std::make_unique<SharedStringSource>(it->second.bytes));
}

int64_t MemoryBlobStore::gets(std::string_view key) {
  std::lock_guard lock(mu_);
  auto it = gets_.find(key);
  return it == gets_.end() ? 0 : it->second;
}

StatusOr<BlobInfo> MemoryBlobStore::Head(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::lock_guard lock(mu_);
  auto it = blobs_.find(key);
  if (it == blobs_.end()) return NotFound(key);
  return BlobInfo{it->first, it->second.bytes->size(), it->second.sha256};
}

StatusOr<std::filesystem::path> MemoryBlobStore::LocalPath(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(Head(key).status());
  return FailedPreconditionError("the in-memory blob store has no local files; read blob '" + std::string(key) +
                                 "' with Get()");
}

Status MemoryBlobStore::Delete(std::string_view key) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKey(key));
  std::lock_guard lock(mu_);
  auto it = blobs_.find(key);
  if (it == blobs_.end()) return NotFound(key);
  blobs_.erase(it);
  return Status::Ok();
}

StatusOr<std::vector<std::string>> MemoryBlobStore::List(std::string_view prefix) {
  PARSYN_RETURN_IF_ERROR(ValidateBlobKeyPrefix(prefix));
  std::lock_guard lock(mu_);
  std::vector<std::string> keys;
  for (auto it = blobs_.lower_bound(prefix); it != blobs_.end() && it->first.starts_with(prefix); ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

void MemoryBlobStore::FailNextPuts(int count, Status error) {
  std::lock_guard lock(mu_);
  puts_to_fail_ = count;
  put_error_ = std::move(error);
}

}  // namespace parsyn::storage
