#include "base/temp_file.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace parsyn {
namespace {

// mkstemp and mkdtemp replace these six characters with random ones.
std::string NamePattern(const std::filesystem::path& dir, std::string_view stem) {
  return (dir / (std::string(stem) + "-XXXXXX")).string();
}

}  // namespace

StatusOr<TempFile> CreateTempFile(const std::filesystem::path& dir, std::string_view stem) {
  std::string name = NamePattern(dir, stem);
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return UnavailableError("cannot create a file in " + dir.string() + ": " + std::strerror(errno));
  return TempFile{.fd = fd, .path = name};
}

StatusOr<std::filesystem::path> CreateTempDir(const std::filesystem::path& parent, std::string_view stem) {
  std::string name = NamePattern(parent, stem);
  if (::mkdtemp(name.data()) == nullptr) {
    return UnavailableError("cannot create a directory in " + parent.string() + ": " + std::strerror(errno));
  }
  return std::filesystem::path(name);
}

}  // namespace parsyn
