// How a trainer program is started (docs/trainer-contract.md): TrainerSupervisor (trainer_supervisor.h) runs every
// trainer through a TrainerLauncher, so tests can script a trainer's output without a process.
// ProcessTrainerLauncher is the real one: the command as a child process.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
class ProcessTrainerLauncher : public TrainerLauncher {
 public:
  explicit ProcessTrainerLauncher(std::chrono::milliseconds stop_grace = kTrainerStopGrace) : stop_grace_(stop_grace) {}
  StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>& argv) override;

 private:
  std::chrono::milliseconds stop_grace_;
};

}  // namespace parsyn::worker
