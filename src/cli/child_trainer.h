// parsyn-trainer as a child process (`parsyn-trainer run TASK.json`, found by FindTrainer): the TrainerLauncher of the
// commands that run the worker's tasks, `parsyn worker` and `parsyn simulate`. Terminate sends SIGTERM, then SIGKILL
// after a grace period if the trainer has not exited.
#pragma once

#include <filesystem>
#include <memory>

#include "base/status.h"
#include "worker/trainer_launcher.h"

namespace parsyn::cli {

class ChildTrainerLauncher : public worker::TrainerLauncher {
 public:
  StatusOr<std::unique_ptr<worker::TrainerRun>> Start(const std::filesystem::path& task_file) override;
};

}  // namespace parsyn::cli
