// How a trainer program is started (docs/trainer-contract.md): TrainerSupervisor (trainer_supervisor.h) runs every
// trainer through a TrainerLauncher, so tests can script a trainer's output without a process.
// ProcessTrainerLauncher is the real one: the command as a child process.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/fork_server.h"
#include "base/status.h"

namespace parsyn::worker {

// One running trainer. ReadLine and Wait are called from the supervising thread; Terminate may be called from any
// thread (an abandon, a stop, the deadline's watchdog) while ReadLine blocks.
class TrainerRun {
 public:
  virtual ~TrainerRun() = default;
  // The next line of the trainer's stdout, nullopt at its end.
  virtual std::optional<std::string> ReadLine() = 0;
  // Asks the trainer to stop (SIGTERM), and kills it (SIGKILL) if it has not exited after the contract's grace
  // period. Idempotent.
  virtual void Terminate() = 0;
  // Waits for exit: the exit code, or 128 + signal number.
  virtual int Wait() = 0;
};

class TrainerLauncher {
 public:
  virtual ~TrainerLauncher() = default;
  // Starts `argv` (argv[0] the program). NotFound when the program does not exist or is not executable; Internal
  // when it cannot start.
  virtual StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>& argv) = 0;
};

// How long a trainer asked to stop (SIGTERM) may take before it is killed: the contract's 10 s.
inline constexpr std::chrono::seconds kTrainerStopGrace{10};

// Trainers as child processes of this one: stdout a pipe, stderr this process's, killed if this process dies
// (SubprocessOptions::die_with_parent). `stop_grace` is kTrainerStopGrace but in tests.
//
// Runs of parsyn-trainer (named by ForkRunsOf) are forked instead from one `parsyn-trainer --fork-server` this
// launcher starts (base/fork_server.h): loading libtorch, most of that program's start (about 0.85 s of
// CPU), is then paid once per launcher, not once per task. The server lives as long as the launcher, holding one
// started copy of the program. A run is the server's child rather than this process's, and dies with it, as the
// server dies with this process. When the server cannot start or is gone, runs start as separate programs from then
// on, and the reason is logged once.
class ProcessTrainerLauncher : public TrainerLauncher {
 public:
  explicit ProcessTrainerLauncher(std::chrono::milliseconds stop_grace = kTrainerStopGrace) : stop_grace_(stop_grace) {}
  ~ProcessTrainerLauncher() override;
  // Starts `program --fork-server` (`program`: parsyn-trainer's path) and forks the runs whose argv[0] is `program`
  // from it. Call it on the main thread: the server dies with the thread that started it (PR_SET_PDEATHSIG is a
  // thread's, not a process's). Not thread-safe with Start.
  void ForkRunsOf(std::filesystem::path program);
  StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>& argv) override;
  // Whether runs of ForkRunsOf's program are forked: false before it, and once its server could not start or failed.
  bool ForksRuns() { return ForkServerForRuns() != nullptr; }

 private:
  // The fork server; null when there is none or it has failed.
  ForkServer* ForkServerForRuns();

  std::chrono::milliseconds stop_grace_;
  std::filesystem::path forkable_;
  std::mutex fork_mutex_;
  std::unique_ptr<ForkServer> fork_server_;
  bool fork_server_failed_ = false;
};

}  // namespace parsyn::worker
