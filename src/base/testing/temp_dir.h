// Test support (header-only; for tests and benchmarks, never for production code): a fresh directory that lives as
// long as the object.
//
// Contract: the constructor makes <temp>/<prefix>-XXXXXX with mkdtemp, where <temp> is
// std::filesystem::temp_directory_path() ($TMPDIR, else /tmp). When it cannot, it prints why and aborts: no test can
// go on without its directory, and a machine without a writable temp dir is broken. The destructor removes the
// directory and everything in it, ignoring errors, unless the environment variable named by `keep_if_set` is set
// (for looking at what a failed run left). Not copyable. Not thread-safe; one owner.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace parsyn::test_support {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix, const char* keep_if_set = nullptr) : keep_if_set_(keep_if_set) {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string pattern = (base / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "TempDir: mkdtemp(%s) failed: %s\n", pattern.c_str(), std::strerror(errno));
      std::abort();
    }
    path_ = pattern;
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
