#include "storage/local_blob_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "base/sha256.h"
#include "base/temp_file.h"

namespace parsyn::storage {

namespace fs = std::filesystem;

StatusOr<LocalBlobCopy> LocalBlobCopy::Open(BlobStore& blobs, std::string_view key, const fs::path& spool_dir,
                                            std::optional<uint64_t> max_bytes) {
  LocalBlobCopy copy;
  StatusOr<fs::path> local = blobs.LocalPath(key);
  if (local.ok()) {
    PARSYN_ASSIGN_OR_RETURN(BlobInfo info, blobs.Head(key));
    if (max_bytes && info.size_bytes > *max_bytes) {
      return ResourceExhaustedError(std::string(key) + " is " + std::to_string(info.size_bytes) +
                                    " bytes, more than the " + std::to_string(*max_bytes) + " bytes allowed");
    }
    copy.path_ = *local;
    copy.size_bytes_ = info.size_bytes;
    copy.sha256_ = info.sha256;
    return copy;
  }
  if (local.status().code() != StatusCode::kFailedPrecondition) return local.status();

  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, blobs.Get(key));
  std::error_code ec;
  fs::create_directories(spool_dir, ec);
  if (ec) return UnavailableError("cannot create " + spool_dir.string() + ": " + ec.message());
  PARSYN_ASSIGN_OR_RETURN(TempFile spool, CreateTempFile(spool_dir, "blob"));
  const int fd = spool.fd;
  copy.path_ = spool.path;
  copy.remove_on_destroy_ = true;  // from here on, every return removes the file
  Sha256 hash;
  std::vector<std::byte> buffer(size_t{1} << 20);
  Status failure = Status::Ok();
  while (failure.ok()) {
    StatusOr<size_t> n = source->Read(buffer);
    if (!n.ok()) {
      failure = n.status().WithContext("reading " + std::string(key));
      break;
    }
    if (*n == 0) break;
    copy.size_bytes_ += *n;
    if (max_bytes && copy.size_bytes_ > *max_bytes) {
      failure = ResourceExhaustedError(std::string(key) + " is more than the " + std::to_string(*max_bytes) +
                                       " bytes allowed");
      break;
    }
    hash.Update(std::span<const std::byte>(buffer.data(), *n));
    for (size_t done = 0; done < *n;) {
      const ssize_t w = ::write(fd, buffer.data() + done, *n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failure = UnavailableError("cannot write " + copy.path_.string() + ": " + std::strerror(errno));
        break;
      }
      done += static_cast<size_t>(w);
    }
  }
  ::close(fd);
  if (!failure.ok()) return failure;
  copy.sha256_ = hash.HexDigest();
  return copy;
}

LocalBlobCopy::~LocalBlobCopy() {
  if (remove_on_destroy_) {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
}

LocalBlobCopy::LocalBlobCopy(LocalBlobCopy&& other) noexcept
    : path_(std::move(other.path_)),
      size_bytes_(other.size_bytes_),
      sha256_(std::move(other.sha256_)),
      remove_on_destroy_(std::exchange(other.remove_on_destroy_, false)) {}

LocalBlobCopy& LocalBlobCopy::operator=(LocalBlobCopy&& other) noexcept {
  if (this != &other) {
    if (remove_on_destroy_) {
      std::error_code ignored;
      fs::remove(path_, ignored);
    }
    path_ = std::move(other.path_);
    size_bytes_ = other.size_bytes_;
    sha256_ = std::move(other.sha256_);
    remove_on_destroy_ = std::exchange(other.remove_on_destroy_, false);
  }
  return *this;
}

}  // namespace parsyn::storage
