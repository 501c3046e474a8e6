// ProcessTrainerLauncher: a trainer as a child process of this program (trainer_launcher.h).
#include "worker/trainer_launcher.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "base/subprocess.h"

namespace parsyn::worker {
namespace {

// A trainer child (a Subprocess, or a ForkedProcess of the fork server): Terminate sends SIGTERM, then SIGKILL after
// the grace period if it has not exited.
template <typename Process>
class ChildTrainerRun : public TrainerRun {
 public:
  ChildTrainerRun(Process child, std::chrono::milliseconds stop_grace)
      : child_(std::move(child)), stop_grace_(stop_grace) {}
  ~ChildTrainerRun() override {
    {
      std::lock_guard lock(mutex_);
      exited_ = true;  // the Process destructor kills one that was never waited for
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
    const int code = child_.Wait();  // signals from Terminate never reach a recycled pid (subprocess.h, fork_server.h)
    {
      std::lock_guard lock(mutex_);
      exited_ = true;
    }
    exited_cv_.notify_all();
    return code;
  }

 private:
  Process child_;
  std::chrono::milliseconds stop_grace_;
  std::mutex mutex_;
  std::condition_variable exited_cv_;
  bool exited_ = false;
  bool terminating_ = false;
  std::thread killer_;
};

}  // namespace

ProcessTrainerLauncher::~ProcessTrainerLauncher() = default;

void ProcessTrainerLauncher::ForkRunsOf(std::filesystem::path program) {
  forkable_ = std::move(program);
  StatusOr<std::unique_ptr<ForkServer>> started = ForkServer::Start(forkable_, {"--fork-server"});
  std::lock_guard lock(fork_mutex_);
  if (started.ok()) {
    fork_server_ = std::move(*started);
    return;
  }
  PARSYN_LOG_WARN("cannot start {} --fork-server ({}): each trainer run starts the program anew", forkable_.string(),
                  started.status().message());
  fork_server_failed_ = true;
}

ForkServer* ProcessTrainerLauncher::ForkServerForRuns() {
  std::lock_guard lock(fork_mutex_);
  return fork_server_failed_ ? nullptr : fork_server_.get();
}

StatusOr<std::unique_ptr<TrainerRun>> ProcessTrainerLauncher::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgumentError("a trainer command needs a program");
  if (!forkable_.empty() && argv[0] == forkable_.string()) {
    if (ForkServer* server = ForkServerForRuns()) {
      StatusOr<ForkedProcess> run = server->Fork(argv);
      if (run.ok()) {
        return std::unique_ptr<TrainerRun>(
            std::make_unique<ChildTrainerRun<ForkedProcess>>(std::move(*run), stop_grace_));
      }
      PARSYN_LOG_WARN("{}'s fork server failed ({}): each trainer run starts the program anew from now on",
                      forkable_.string(), run.status().message());
      std::lock_guard lock(fork_mutex_);
      fork_server_failed_ = true;  // the server stays until the launcher goes: runs forked earlier may be using it
    }
  }
  // The trainer dies with this process, even a SIGKILLed one (SubprocessOptions::die_with_parent).
  SubprocessOptions spawn;
  spawn.die_with_parent = true;
  const std::vector<std::string> args(argv.begin() + 1, argv.end());
  PARSYN_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start(argv[0], args, spawn));
  return std::unique_ptr<TrainerRun>(std::make_unique<ChildTrainerRun<Subprocess>>(std::move(child), stop_grace_));
}

}  // namespace parsyn::worker
