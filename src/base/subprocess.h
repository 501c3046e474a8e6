// Subprocess: the one way the platform starts a child program (posix_spawn): the CLI's trainer runs, its managed
// workers, the worker's parsyn-trainer, the demo's background processes. POSIX only.
//
// Descriptors: the child gets stdin, stdout and stderr, nothing else of this process.
// Output: the child's stdout is a pipe the parent reads line by line (default), or inherited, or a file that takes
// stdout and stderr both. stderr is otherwise inherited.
// Threads: ReadLine and Wait are called from one thread. Signal/Terminate/Kill may be called from any thread at any
// time, also while Wait blocks: Wait reaps the child under the same lock, so a signal never reaches a recycled pid.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace parsyn {

struct SubprocessOptions {
  enum class Output { kPipe, kInherit, kFile };
  Output output = Output::kPipe;
  std::filesystem::path output_file;  // kFile: the child's stdout and stderr, created or truncated
  // Set in the child's environment on top of this process's (replacing variables of the same name).
  std::vector<std::pair<std::string, std::string>> environment;
  // The child is killed (SIGKILL) when this process dies, even by SIGKILL. posix_spawn cannot set
  // PR_SET_PDEATHSIG in the child, and fork+prctl+exec from a large multi-threaded parent (libtorch, the worker's
  // threads) is what posix_spawn exists to avoid; so the child does it itself: it gets kDieWithParentEnv=<this pid>
  // and must call DieWithParentIfAsked() first thing in main (parsyn-trainer does).
  bool die_with_parent = false;
  // >= 0: the child's stdin is this descriptor (ForkServer's control channel); else this process's stdin.
  int stdin_fd = -1;
};

// The environment variable behind SubprocessOptions::die_with_parent: the pid of the parent to die with.
inline constexpr char kDieWithParentEnv[] = "PARSYN_DIE_WITH_PARENT";

// In a child started with die_with_parent: asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG), then
// checks the parent is still the one named (it may have died before the request: then this process kills itself).
// Removes the variable, so that this process's own children do not act on it. Does nothing when it is not set.
void DieWithParentIfAsked();

class Subprocess {
 public:
  // Starts `program` with `args` (argv[0] is the program's path). NotFound if the program does not exist or is not
  // executable; Internal if the spawn fails.
  static StatusOr<Subprocess> Start(const std::filesystem::path& program, const std::vector<std::string>& args,
                                    const SubprocessOptions& options = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  Subprocess(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps a child that was not waited for.
  ~Subprocess();

  // The next line of the child's stdout without its newline; nullopt at end of output (or without a pipe).
  std::optional<std::string> ReadLine();
  // Sends `signal` unless the child has been reaped already.
  void Signal(int signal);
  void Terminate();  // SIGTERM
  void Kill();       // SIGKILL
  // Waits for exit and reaps the child: its exit code, or 128 + the number of the signal that ended it.
  int Wait();
  // Whether the child has exited (without reaping it; Wait still returns its status).
  bool HasExited();
  pid_t pid() const;

 private:
  struct State;
  explicit Subprocess(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The next line of a child's output (`out`, a pipe) without its newline, nullopt at its end. Reads on through
// interruptions by signals.
std::optional<std::string> ReadOutputLine(std::FILE* out);

// The path of the running executable (/proc/self/exe), for finding programs installed beside it.
StatusOr<std::filesystem::path> SelfExecutablePath();

}  // namespace parsyn
