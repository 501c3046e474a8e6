#include "base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace parsyn {

StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::filesystem::path& destination, mode_t mode) {
  // The temporary name carries the pid so two processes writing the same destination do not share a temp file.
  std::filesystem::path temporary = destination;
  temporary += ".tmp." + std::to_string(::getpid());
  ::unlink(temporary.c_str());  // a stale one (a crash, a recycled pid) would keep its old mode
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return UnavailableError("cannot create " + temporary.string() + ": " + std::strerror(errno));
  return AtomicFileWriter(destination, temporary, fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : destination_(std::move(other.destination_)),
      temporary_(std::move(other.temporary_)),
      fd_(other.fd_),
      committed_(other.committed_) {
  other.fd_ = -1;
  other.committed_ = true;  // the moved-from writer owns nothing to clean up
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

Status AtomicFileWriter::Append(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("writing " + temporary_.string() + ": " + std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status AtomicFileWriter::Commit(bool durable) {
  if (durable && ::fsync(fd_) != 0)
    return UnavailableError("fsync " + temporary_.string() + ": " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(temporary_.c_str(), destination_.c_str()) != 0) {
    return UnavailableError("renaming " + temporary_.string() + " to " + destination_.string() + ": " +
                            std::strerror(errno));
  }
  committed_ = true;
  if (!durable) return Status::Ok();
  // The rename is durable only once the directory entry is; a failure here leaves a complete file, so say nothing.
  std::filesystem::path dir = destination_.parent_path();
  if (dir.empty()) dir = ".";
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::filesystem::path& destination, std::string_view bytes, mode_t mode) {
  PARSYN_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(destination, mode));
  PARSYN_RETURN_IF_ERROR(writer.Append(bytes));
  return writer.Commit();
}

}  // namespace parsyn
