// How the agent runs parsyn-trainer without linking libtorch or the CLI: the program that hosts the agent (the
// `parsyn worker` command) supplies a TrainerLauncher over its child-process support; tests supply fakes.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"

namespace parsyn::worker {

// One running `parsyn-trainer run TASK.json`. ReadLine and Wait are called from the agent's task thread;
// Terminate may be called from any thread (the heartbeat thread when the coordinator abandons the task, the
// signal watcher on SIGTERM) while ReadLine blocks.
class TrainerRun {
 public:
  virtual ~TrainerRun() = default;
  // The next line of the trainer's stdout, nullopt at its end.
  virtual std::optional<std::string> ReadLine() = 0;
  // Asks the trainer to stop (SIGTERM; it checks between micro-batches). Idempotent.
  virtual void Terminate() = 0;
  // Waits for exit: the exit code, or 128 + signal number.
  virtual int Wait() = 0;
};

class TrainerLauncher {
 public:
  virtual ~TrainerLauncher() = default;
  // Starts the trainer on a task file. NotFound when no trainer program exists; Internal when it cannot start.
  virtual StatusOr<std::unique_ptr<TrainerRun>> Start(const std::filesystem::path& task_file) = 0;
};

}  // namespace parsyn::worker
