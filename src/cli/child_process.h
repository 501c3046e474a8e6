// A child process whose stdout the parent reads line by line (stderr passes through to the parent's): how `parsyn`
// runs `parsyn-trainer` for torch work. POSIX only. A ChildProcess is used from one thread.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace parsyn::cli {

class ChildProcess {
 public:
  // Starts `program` with `args` (argv[0] is the program's path). NotFound if the program does not exist or is not
  // executable; Internal if the spawn fails.
  static StatusOr<ChildProcess> Start(const std::filesystem::path& program, const std::vector<std::string>& args);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  // Kills (SIGKILL) and reaps a child that was not waited for.
  ~ChildProcess();

  // The next line of the child's stdout without its newline; nullopt at end of output.
  std::optional<std::string> ReadLine();
  // Waits for exit; returns the exit code, or 128 + signal number when a signal ended it.
  int Wait();
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, FILE* out) : pid_(pid), out_(out) {}
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool waited_ = false;
};

// The path of the running executable (/proc/self/exe), for finding programs installed beside it.
StatusOr<std::filesystem::path> SelfExecutablePath();

// parsyn-trainer: $PARSYN_TRAINER when set, else the file beside this executable. NotFound (saying where it looked)
// when neither exists.
StatusOr<std::filesystem::path> FindTrainer();

}  // namespace parsyn::cli
