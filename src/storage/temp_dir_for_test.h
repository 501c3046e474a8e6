// A fresh directory under $TMPDIR (or /tmp), removed with everything in it when the object goes away. Tests only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace parsyn::storage {

class TempDirForTest {
 public:
  TempDirForTest() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/parsyn-storage-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();  // a test machine without a writable /tmp is broken
    path_ = pattern;
  }
  ~TempDirForTest() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDirForTest(const TempDirForTest&) = delete;
  TempDirForTest& operator=(const TempDirForTest&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace parsyn::storage
