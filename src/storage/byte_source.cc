#include "storage/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace parsyn::storage {
namespace {

class FileByteSource final : public ByteSource {
 public:
  FileByteSource(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  ~FileByteSource() override { ::close(fd_); }
  FileByteSource(const FileByteSource&) = delete;
  FileByteSource& operator=(const FileByteSource&) = delete;

  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    while (true) {
      ssize_t n = ::read(fd_, buffer.data(), buffer.size());
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      return UnavailableError("reading " + path_.string() + ": " + std::strerror(errno));
    }
  }

 private:
  int fd_;
  std::filesystem::path path_;
};

}  // namespace

StatusOr<size_t> StringByteSource::Read(std::span<std::byte> buffer) {
  size_t n = std::min(buffer.size(), bytes_.size() - offset_);
  std::memcpy(buffer.data(), bytes_.data() + offset_, n);
  offset_ += n;
  return n;
}

StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFoundError("no such file: " + path.string());
    return UnavailableError("opening " + path.string() + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotFoundError("not a regular file: " + path.string());
  }
  return std::unique_ptr<ByteSource>(std::make_unique<FileByteSource>(fd, path));
}

StatusOr<std::string> ReadAll(ByteSource& source, size_t max_bytes) {
  std::string out;
  std::byte chunk[64 * 1024];
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(size_t n, source.Read(chunk));
    if (n == 0) return out;
    if (out.size() + n > max_bytes) {
      return ResourceExhaustedError("stream holds more than " + std::to_string(max_bytes) + " bytes");
    }
    out.append(reinterpret_cast<const char*>(chunk), n);
  }
}

}  // namespace parsyn::storage
