// Test support (header-only; for tests and benchmarks, never for production code): where the tree that built the
// running binary lies, read at run time from the build directory's parsyn_build_paths.txt (written by the top-level
// CMakeLists.txt).
//
// Why at run time: a path compiled in (`-DPARSYN_BIN="/home/me/parsyn/build/..."`) is part of the compiler's command
// line, so every clone of the tree, CI's clean checkout included, misses ccache for each file that uses one.
//
// Contract: BuildPath(key) finds the nearest directory above /proc/self/exe holding parsyn_build_paths.txt and
// returns the value of its `key=value` line. Keys: `source_dir` (the tree CMake configured), `parsyn` (the CLI and
// server), `parsyn-trainer`, `stand-in-nvml` (worker/testing/stand_in_nvml.cc, built as a shared library); a build
// without libtorch has no `parsyn-trainer`. SourcePath("docs/openapi.yaml") is BuildPath("source_dir") / that.
// A missing file or key prints what is missing and aborts: no test can go on without its programs, and the cause is
// a binary moved out of its build directory or a stale build (rerun cmake). Reads the file on each call.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace parsyn::test_support {

inline std::string BuildPath(std::string_view key) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (std::filesystem::path dir = exe.parent_path(); !ec && !dir.empty(); dir = dir.parent_path()) {
    std::ifstream file(dir / "parsyn_build_paths.txt");
    if (file) {
      std::string line;
      while (std::getline(file, line)) {
        if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == '=') {
          return line.substr(key.size() + 1);
        }
      }
      std::fprintf(stderr, "%s has no '%.*s' (a build without that target?); rerun cmake\n",
                   (dir / "parsyn_build_paths.txt").c_str(), static_cast<int>(key.size()), key.data());
      std::abort();
    }
    if (dir == dir.root_path()) break;
  }
  std::fprintf(stderr, "no parsyn_build_paths.txt above %s: run the binary inside the build directory that made it\n",
               exe.c_str());
  std::abort();
}

inline std::string SourcePath(std::string_view relative) {
  return (std::filesystem::path(BuildPath("source_dir")) / relative).string();
}

}  // namespace parsyn::test_support
