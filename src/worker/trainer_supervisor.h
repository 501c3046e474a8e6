// TrainerSupervisor: the one place that runs a trainer under the trainer contract (docs/trainer-contract.md) for the
// worker agent, `parsyn simulate` and `parsyn trainer check`: it starts the command, reads its stdout events with the
// protocol's one parser, forwards progress, enforces the task's deadline, cancels on request (SIGTERM, then SIGKILL
// after kTrainerStopGrace), and checks what the trainer wrote (the result; a train task's update against the initial
// weights' layout, its values finite) before anything leaves the machine.
//
// A trainer that breaks a rule fails the task with InvalidArgument (DeadlineExceeded for `timeout`) whose message
// names the trainer, the rule and the tensor or line:
//   "trainer 'tabular' broke rule 'layout': tensor 'layers.0.weight' has shape [4, 3], expected [16, 3]"
// The rules are the contract's table: exit, timeout, stdout, event, done, result, update, layout, finite. A trainer
// that fails and says why (an error event, a non-zero exit) fails the task with its own words, as FailedPrecondition
// (ResourceExhausted for the out-of-memory exit code):
//   "trainer 'builtin' exited with status 1: invalid_argument: data.csv:3: ..."
//
// Threads: Run and Describe block their caller; the stop token may be requested from any thread. A supervisor holds
// no state between calls: several threads may run trainers through one at once.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "protocol/trainer_events.h"
#include "protocol/trainer_task.h"
#include "worker/trainer_launcher.h"

namespace parsyn::worker {

// A trainer a worker offers: the name jobs choose it by (config.trainer) and the command line that runs it; the
// supervisor appends "--describe" or "run TASK_FILE".
struct TrainerCommand {
  std::string name;
  std::vector<std::string> argv;  // argv[0]: the program's path
  // The command line as one string, for messages.
  std::string CommandLine() const;
  friend bool operator==(const TrainerCommand&, const TrainerCommand&) = default;
};

// A trainer with its `--describe` answer: what a worker offers and announces in its hello.
struct DescribedTrainer {
  TrainerCommand command;
  protocol::TrainerDescription description;
};

// Splits a command line into words as a POSIX shell would without expansions: blanks separate words, single quotes
// keep everything, double quotes keep all but \" and \\, a backslash outside quotes escapes the next character.
// InvalidArgument for an unterminated quote or an empty command.
StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line);

// "NAME=COMMAND" (`parsyn worker --trainer`): NAME a trainer name (protocol::IsTrainerName), COMMAND split by
// SplitCommandLine with its program looked up in $PATH when it has no '/'. InvalidArgument naming what is wrong;
// NotFound when the program does not exist or is not executable.
StatusOr<TrainerCommand> ParseTrainerCommand(std::string_view spec);

// The program `name` as $PATH finds it (as given when it holds a '/'); NotFound saying where it looked.
StatusOr<std::filesystem::path> FindProgram(std::string_view name);

// What a task's trainer wrote, checked.
struct TrainerOutput {
  protocol::TrainerResult result;
  std::filesystem::path update;  // a train task's update; empty for an evaluate task
  std::string update_sha256;     // of the update's bytes, computed here (never taken from the trainer)
};

struct TrainerRunOptions {
  // When the trainer is stopped and the task fails by the `timeout` rule; max(): none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::stop_token stop;  // requested: the trainer is stopped and Run returns Cancelled
  // Each progress event, on the calling thread, as it is read.
  std::function<void(const protocol::TrainerProgress&)> on_progress;
};

class TrainerSupervisor {
 public:
  explicit TrainerSupervisor(TrainerLauncher& launcher) : launcher_(launcher) {}

  // `COMMAND --describe`, within `timeout`: the trainer's description. InvalidArgument naming the trainer and what
  // was wrong (exit status, output that is not the description, no contract version 1); the launcher's NotFound.
  StatusOr<protocol::TrainerDescription> Describe(const TrainerCommand& trainer,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // `COMMAND run TASK_FILE` for `task` (already written to `task_file`), and the checks of its output. Errors: the
  // rule broken (above); Cancelled when options.stop was requested; the launcher's NotFound/Internal.
  StatusOr<TrainerOutput> Run(const TrainerCommand& trainer, const std::filesystem::path& task_file,
                              const protocol::TrainerTask& task, const TrainerRunOptions& options);

 private:
  TrainerLauncher& launcher_;
};

// Describes each trainer (TrainerSupervisor::Describe), in order. The first failure, naming the trainer.
StatusOr<std::vector<DescribedTrainer>> DescribeTrainers(TrainerSupervisor& supervisor,
                                                         const std::vector<TrainerCommand>& trainers);

// The contract's output checks on their own (Run applies them; `parsyn trainer check` reports them): the result file
// of `task` and, for a train task, its update against `task.initial_weights`. Errors as Run's, naming `trainer`.
StatusOr<TrainerOutput> CheckTrainerOutput(std::string_view trainer, const protocol::TrainerTask& task,
                                           const std::filesystem::path& task_dir);

// "trainer 'NAME' broke rule 'RULE': DETAIL" as InvalidArgument.
Status TrainerRuleError(std::string_view trainer, std::string_view rule, std::string_view detail);

}  // namespace parsyn::worker
