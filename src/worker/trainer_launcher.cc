// ProcessTrainerLauncher: a trainer as a child process of this program (trainer_launcher.h).
#include "worker/trainer_launcher.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/subprocess.h"

namespace parsyn::worker {
namespace {

// A trainer child: Terminate sends SIGTERM, then SIGKILL after the grace period if it has not exited.
class ChildTrainerRun : public TrainerRun {
 public:
  ChildTrainerRun(Subprocess child, std::chrono::milliseconds stop_grace)
      : child_(std::move(child)), stop_grace_(stop_grace) {}
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
      if (!exited_cv_.wait_for(lock, stop_grace_, [this] { return exited_; })) child_.Kill();
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
  std::chrono::milliseconds stop_grace_;
  std::mutex mutex_;
  std::condition_variable exited_cv_;
  bool exited_ = false;
  bool terminating_ = false;
  std::thread killer_;
};

}  // namespace

StatusOr<std::unique_ptr<TrainerRun>> ProcessTrainerLauncher::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgumentError("a trainer command needs a program");
  // The trainer dies with this process, even a SIGKILLed one (SubprocessOptions::die_with_parent).
  SubprocessOptions spawn;
  spawn.die_with_parent = true;
  const std::vector<std::string> args(argv.begin() + 1, argv.end());
  PARSYN_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start(argv[0], args, spawn));
  return std::unique_ptr<TrainerRun>(std::make_unique<ChildTrainerRun>(std::move(child), stop_grace_));
}

}  // namespace parsyn::worker
