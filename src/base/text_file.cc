#include "base/text_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace parsyn {

StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UnavailableError("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return UnavailableError("cannot read " + path.string());
  return ss.str();
}

StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path) {
  PARSYN_ASSIGN_OR_RETURN(std::string s, ReadWholeFile(path));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

Status WriteNewSecretFile(const std::filesystem::path& path, std::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return AlreadyExistsError(path.string() + " already exists");
    return UnavailableError("cannot create " + path.string() + ": " + std::strerror(errno));
  }
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return UnavailableError("cannot write " + path.string() + ": " + std::strerror(errno));
    }
    written += static_cast<size_t>(n);
  }
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return UnavailableError("cannot fsync " + path.string() + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace parsyn
