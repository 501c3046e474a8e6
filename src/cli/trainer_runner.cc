#include "cli/trainer_runner.h"

#include <signal.h>

#include <cstdlib>

#include "base/subprocess.h"

namespace parsyn::cli {
namespace {

void IgnoreInterrupt(int) {}

// Installs a do-nothing SIGINT handler for its lifetime. A handler, unlike SIG_IGN, is reset to the default by exec,
// so the trainer still gets Ctrl-C and stops between steps; we keep running to report how it ended.
class InterruptShield {
 public:
  InterruptShield() {
    struct sigaction action {};
    action.sa_handler = IgnoreInterrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~InterruptShield() { sigaction(SIGINT, &previous_, nullptr); }
  InterruptShield(const InterruptShield&) = delete;
  InterruptShield& operator=(const InterruptShield&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace

StatusOr<TrainerOutcome> RunTrainer(const std::vector<std::string>& args,
                                    const std::function<void(const nlohmann::json&)>& on_event) {
  PARSYN_ASSIGN_OR_RETURN(const std::filesystem::path trainer, FindTrainer());
  InterruptShield shield;
  // The trainer's error reaches the user once: from its error event, through TrainerFailureMessage.
  SubprocessOptions options;
  options.environment.emplace_back(protocol::kTrainerEventsOnlyEnv, "1");
  PARSYN_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start(trainer, args, options));
  TrainerOutcome outcome;
  while (std::optional<std::string> line = child.ReadLine()) {
    nlohmann::json event = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) continue;  // not ours (a library printing to stdout): skip it
    const std::string kind = event.value("event", "");
    if (kind == "done") outcome.done = event;
    if (kind == "error") outcome.error = event;
    if (on_event) on_event(event);
  }
  outcome.exit_code = child.Wait();
  return outcome;
}

StatusOr<std::filesystem::path> FindTrainer() {
  if (const char* env = std::getenv("PARSYN_TRAINER"); env && *env) return std::filesystem::path(env);
  PARSYN_ASSIGN_OR_RETURN(const std::filesystem::path self, SelfExecutablePath());
  const std::filesystem::path beside = self.parent_path() / "parsyn-trainer";
  if (std::filesystem::exists(beside)) return beside;
  return NotFoundError("parsyn-trainer not found beside " + self.string() +
                       " (build it with the trainer enabled, or set PARSYN_TRAINER to its path)");
}

std::string TrainerFailureMessage(const TrainerOutcome& outcome) {
  if (outcome.error.is_object() && outcome.error.contains("message")) {
    return outcome.error["message"].get<std::string>();
  }
  if (outcome.exit_code == protocol::kTrainerExitStopped) return "stopped";
  if (outcome.exit_code >= 128) return "parsyn-trainer was killed by signal " + std::to_string(outcome.exit_code - 128);
  return "parsyn-trainer exited with status " + std::to_string(outcome.exit_code);
}

}  // namespace parsyn::cli
