// What a trainer says back under the trainer contract (docs/trainer-contract.md): its `--describe` answer, the JSON
// lines it prints on stdout (progress, done, error) and its result file. Typed here once, with one reader and one
// writer each: parsyn-trainer writes them, the worker's TrainerSupervisor and `parsyn trainer check` read them.
// Plain values and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace parsyn::protocol {

// The one contract version this code reads and writes.
inline constexpr int kTrainerContractVersion = 1;
// A trainer's exit codes: 0 done; these otherwise.
inline constexpr int kTrainerExitFailed = 1;
inline constexpr int kTrainerExitUsage = 2;
inline constexpr int kTrainerExitStopped = 3;  // SIGTERM or SIGINT
inline constexpr int kTrainerExitOutOfMemory = 4;
// Set to "1" in parsyn-trainer's environment by a parent that shows its error events itself (`parsyn train`): the
// trainer then writes no second copy of the reason on stderr.
inline constexpr char kTrainerEventsOnlyEnv[] = "PARSYN_TRAINER_EVENTS_ONLY";
// The error code of a trainer refusing a task file of another version.
inline constexpr std::string_view kUnsupportedContractVersion = "unsupported_contract_version";
// The model kind a custom model folder (parsyn_model.json) has, and the wildcard of a trainer that trains any.
inline constexpr std::string_view kCustomModelKind = "custom";
inline constexpr std::string_view kAnyModelKind = "*";

// `TRAINER --describe`.
struct TrainerDescription {
  std::vector<int> contract_versions;
  std::vector<std::string> task_kinds;   // "train", "evaluate"
  std::vector<std::string> model_kinds;  // "llama", "tabular-mlp", "custom", ... or "*"
  std::string name;                      // optional
  std::string version;                   // optional

  bool ReadsContract(int version) const;
  bool RunsTaskKind(std::string_view kind) const;
  // True when model_kinds lists `kind` or "*".
  bool TrainsModelKind(std::string_view kind) const;
  friend bool operator==(const TrainerDescription&, const TrainerDescription&) = default;
};
// InvalidArgument naming each problem ("describe.contract_versions must list 1"); unknown keys are ignored.
StatusOr<TrainerDescription> ParseTrainerDescription(const nlohmann::json& object);
nlohmann::json TrainerDescriptionToJson(const TrainerDescription& description);

// The result file (output.result) and the `done` event's fields.
struct TrainerResult {
  int64_t num_samples = 0;
  int64_t num_validation = 0;
  std::optional<double> train_loss;
  // Validation metrics: objects of finite numbers with at least "loss"; null when there are no validation rows.
  nlohmann::json validation_before;
  nlohmann::json validation_after;
  nlohmann::json metrics = nlohmann::json::object();  // numbers by name

  // validation_before's loss, when there is one.
  std::optional<double> ValidationLossBefore() const;
  friend bool operator==(const TrainerResult&, const TrainerResult&) = default;
};
// InvalidArgument naming the key for a missing or mistyped field or a non-finite number; other keys are ignored.
StatusOr<TrainerResult> ParseTrainerResult(const nlohmann::json& object);
nlohmann::json TrainerResultToJson(const TrainerResult& result);

struct TrainerProgress {
  int64_t step = 0;
  int64_t total_steps = 0;
  std::optional<double> loss;
  std::optional<double> throughput;
  std::string throughput_unit;  // kSamplesPerSecond or kTokensPerSecond (messages.h); empty with no throughput
  friend bool operator==(const TrainerProgress&, const TrainerProgress&) = default;
};
struct TrainerDone {
  TrainerResult result;
  friend bool operator==(const TrainerDone&, const TrainerDone&) = default;
};
struct TrainerError {
  std::string code;  // snake_case: "invalid_argument", "non_finite_loss", "unsupported_contract_version", ...
  std::string message;
  friend bool operator==(const TrainerError&, const TrainerError&) = default;
};
// An event of another name ("start", "eval", ...): allowed, and ignored by the worker.
struct TrainerOtherEvent {
  std::string name;
  friend bool operator==(const TrainerOtherEvent&, const TrainerOtherEvent&) = default;
};
using TrainerEvent = std::variant<TrainerProgress, TrainerDone, TrainerError, TrainerOtherEvent>;

// A line of the trainer's stdout as an event object: nullopt when it is not a JSON object with an "event" string
// (the contract's `stdout` rule). Empty lines are for the caller to skip.
std::optional<nlohmann::json> ParseEventObject(std::string_view line);
// The typed event. InvalidArgument naming the field when a progress, done or error event lacks a required field or
// has one of the wrong type, or a number is not finite (the contract's `event` rule).
StatusOr<TrainerEvent> ParseTrainerEvent(const nlohmann::json& object);

// Each event as one JSON object, "event" first; ParseTrainerEvent(Event...ToJson(e)) gives e back.
nlohmann::json TrainerProgressToJson(const TrainerProgress& progress);
nlohmann::json TrainerDoneToJson(const TrainerDone& done);
nlohmann::json TrainerErrorToJson(const TrainerError& error);

}  // namespace parsyn::protocol
