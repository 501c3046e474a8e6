// ChildTrainerLauncher: parsyn-trainer as a child process of this program (child_trainer.h).
#include "cli/child_trainer.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/subprocess.h"
#include "cli/trainer_runner.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

// How long a trainer asked to stop (SIGTERM) may take before it is killed.
constexpr std::chrono::seconds kTrainerStopGrace{10};

// A parsyn-trainer child: Terminate sends SIGTERM, then SIGKILL after the grace period if it has not exited.
class ChildTrainerRun : public worker::TrainerRun {
 public:
  explicit ChildTrainerRun(Subprocess child) : child_(std::move(child)) {}
  ~ChildTrainerRun() override {
    {
      std::lock_guard lock(mutex_);
      exited_ = true;  // the Subprocess destructor kills and reaps one that was never waited for
    }
    exited_cv_.notify_all();
    if (killer_.joinable()) killer_.join();
  }

  std::optional<std::string> ReadLine() override { return child_.ReadLine(); }

  void Terminate() override {
    std::lock_guard lock(mutex_);
    if (exited_ || terminating_) return;
    terminating_ = true;
    child_.Terminate();
    killer_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      if (!exited_cv_.wait_for(lock, kTrainerStopGrace, [this] { return exited_; })) child_.Kill();
    });
  }

  int Wait() override {
    const int code = child_.Wait();  // signals from Terminate never reach a recycled pid (subprocess.h)
    {
      std::lock_guard lock(mutex_);
      exited_ = true;
    }
    exited_cv_.notify_all();
    return code;
  }

 private:
  Subprocess child_;
  std::mutex mutex_;
  std::condition_variable exited_cv_;
  bool exited_ = false;
  bool terminating_ = false;
  std::thread killer_;
};

}  // namespace

StatusOr<std::unique_ptr<worker::TrainerRun>> ChildTrainerLauncher::Start(const fs::path& task_file) {
  PARSYN_ASSIGN_OR_RETURN(const fs::path trainer, FindTrainer());
  // The trainer dies with this process, even a SIGKILLed one (SubprocessOptions::die_with_parent).
  SubprocessOptions spawn;
  spawn.die_with_parent = true;
  PARSYN_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start(trainer, {"run", task_file.string()}, spawn));
  return std::unique_ptr<worker::TrainerRun>(std::make_unique<ChildTrainerRun>(std::move(child)));
}

}  // namespace parsyn::cli
