// Uniquely named temporary files and directories, created atomically by the kernel (mkstemp / mkdtemp), so two
// processes or threads never get the same one. The one place that spells the name pattern those calls require.
#pragma once

#include <filesystem>
#include <string_view>

#include "base/status.h"

namespace parsyn {

// A new, empty file <dir>/<stem>-<6 random characters>, open for reading and writing (mode 0600). The caller owns
// `fd` (close it) and the file (remove or unlink it). Unavailable naming the directory and the system's reason.
// Thread-safe.
struct TempFile {
  int fd = -1;
  std::filesystem::path path;
};
StatusOr<TempFile> CreateTempFile(const std::filesystem::path& dir, std::string_view stem);

// A new, empty directory <parent>/<stem>-<6 random characters> (mode 0700); the caller removes it. Unavailable
// naming the parent and the system's reason. Thread-safe.
StatusOr<std::filesystem::path> CreateTempDir(const std::filesystem::path& parent, std::string_view stem);

}  // namespace parsyn
