// Runs parsyn-trainer as a child process and follows its JSON-lines output: how every `parsyn` command that needs
// torch (train, model init) gets it done without linking libtorch. Used from one thread.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "protocol/trainer_events.h"

namespace parsyn::cli {

struct TrainerOutcome {
  int exit_code = 0;
  nlohmann::json done;   // the "done" event on success
  nlohmann::json error;  // the "error" event on failure, when the trainer wrote one
};

// Starts parsyn-trainer with `args`, passes every JSON event to `on_event`, and waits for it. SIGINT in this process
// is caught (not ignored: the child must still receive the terminal's Ctrl-C and stop cleanly) while the child runs.
// Errors: NotFound when parsyn-trainer cannot be found, Internal when it cannot be started. A trainer that fails is
// not an error here: see TrainerOutcome.
StatusOr<TrainerOutcome> RunTrainer(const std::vector<std::string>& args,
                                    const std::function<void(const nlohmann::json&)>& on_event);

// parsyn-trainer: $PARSYN_TRAINER when set, else the file beside this executable. NotFound (saying where it looked)
// when neither exists.
StatusOr<std::filesystem::path> FindTrainer();

// The one line to show for a failed trainer run: its error message, or its exit status when it wrote none.
std::string TrainerFailureMessage(const TrainerOutcome& outcome);

}  // namespace parsyn::cli
