// Test support (header-only; for tests and benchmarks, never for production code): a fresh directory that lives as
// long as the object.
//
// Contract: the constructor makes a new directory <temp>/<prefix>-<random> (base/temp_file.h), where <temp> is
// std::filesystem::temp_directory_path() ($TMPDIR, else /tmp). When it cannot, it prints why and aborts: no test can
// go on without its directory, and a machine without a writable temp dir is broken. The destructor removes the
// directory and everything in it, ignoring errors, unless the environment variable named by `keep_if_set` is set
// (for looking at what a failed run left). Not copyable. Not thread-safe; one owner.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "base/temp_file.h"

namespace parsyn::test_support {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix, const char* keep_if_set = nullptr) : keep_if_set_(keep_if_set) {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    StatusOr<std::filesystem::path> made = CreateTempDir(base, prefix);
    if (!made.ok()) {
      std::fprintf(stderr, "TempDir: %s\n", made.status().ToString().c_str());
      std::abort();
    }
    path_ = *made;
  }
  ~TempDir() {
    if (keep_if_set_ != nullptr && std::getenv(keep_if_set_) != nullptr) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  const char* keep_if_set_;
  std::filesystem::path path_;
};

}  // namespace parsyn::test_support
