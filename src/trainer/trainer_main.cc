// parsyn-trainer: the program that does all torch work, run as a child process by the worker and by `parsyn`.
//
//   parsyn-trainer --describe
//       Prints what it trains under the trainer contract (docs/trainer-contract.md): the built-in trainer of every
//       worker (the name "builtin").
//   parsyn-trainer run TASK.json
//       Runs one training task (task.h; the contract's task file). Progress goes to stdout as JSON lines; on success
//       the last line is {"event": "done", ...result}. On failure: {"event": "error", "code", "message"} on stdout
//       and one line "parsyn-trainer: <Code>: <reason>" on stderr; a task file of another contract version gets the
//       code "unsupported_contract_version".
//   parsyn-trainer model-init DIR OPTIONS_JSON
//       Writes a new random model folder (model_init.h); OPTIONS_JSON holds ModelInitOptions' fields by name
//       (architecture, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
//       tokenizer_json, vocab_size, tie_word_embeddings, max_position_embeddings, rope_theta, rms_norm_eps, seed,
//       dtype "F32"|"BF16"|"F16"). Prints {"event": "done", "config": {...}}.
//   parsyn-trainer tabular-init DIR OPTIONS_JSON
//       Writes a new tabular model folder (tabular_model.h) for a whole CSV dataset: OPTIONS_JSON is {"data": CSV,
//       "seed": N, "config": {the trainer config's keys (protocol/trainer_task.h): model_type, hidden_sizes,
//       label_column}}. Feature standardisation and the class list come from every row of the file, so a federated
//       job's workers, given this folder, all scale features and number classes alike. Prints {"event": "done", "dir",
//       "spec": tabular_model.json}.
//   parsyn-trainer --fork-server
//       The worker's way to start this program once per worker instead of once per task (base/fork_server.h): with
//       its stdin a fork server's control channel, it forks a copy of itself for each run the worker asks for, which
//       then acts as `parsyn-trainer ARGS...` would. Loading libtorch is most of this program's start.
//   parsyn-trainer merge-adapter MODEL_DIR ADAPTER_DIR OUT_DIR
//       `parsyn adapter merge`: writes MODEL_DIR with the PEFT adapter in ADAPTER_DIR merged into its weights, as a
//       model folder in OUT_DIR (peft_io.h, MergeAdapterFolder). Prints {"event": "done", "dir", "dtype",
//       "config": {...}}.
//
// Exit codes: 0 success; 1 failure (bad input, bad weights, libtorch error); 2 usage error; 3 stopped by SIGTERM or
// SIGINT (checked between micro-batches); 4 out of memory.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "base/fork_server.h"
#include "base/log.h"
#include "base/status.h"
#include "base/subprocess.h"
#include "protocol/trainer_events.h"
#include "protocol/trainer_task.h"
#include "trainer/model_init.h"
#include "trainer/peft_io.h"
#include "trainer/tabular_model.h"
#include "trainer/task.h"

namespace {

using nlohmann::json;
using parsyn::Status;
using parsyn::StatusCode;

// What the built-in trainer trains (TrainerDescription): Llama-family folders and tabular models.
json Description() {
  return parsyn::protocol::TrainerDescriptionToJson(
      {.contract_versions = {parsyn::protocol::kTrainerContractVersion},
       .task_kinds = {"train", "evaluate"},
       .model_kinds = {"llama", "qwen2", "mistral", "tabular-mlp", "tabular-logreg"},
       .name = "parsyn-trainer",
       .version = "0.1.0"});
}

void EmitLine(const json& event) {
  // One write per line, flushed, so a reader on a pipe sees whole lines as they happen.
  const std::string line = event.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

int Fail(const Status& status, std::string_view code = {}) {
  if (code.empty()) code = parsyn::StatusCodeSlug(status.code());
  EmitLine(parsyn::protocol::TrainerErrorToJson({.code = std::string(code), .message = status.message()}));
  // The line on stderr is for a person running the trainer by hand; `parsyn train` prints the event's message itself
  // and asks for none (kEventsOnlyEnv), so the reason is shown once.
  if (const char* events_only = std::getenv(parsyn::protocol::kTrainerEventsOnlyEnv);
      events_only == nullptr || std::string_view(events_only) != "1") {
    std::string line = status.ToString();
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    std::cerr << "parsyn-trainer: " << line << std::endl;
  }
  switch (status.code()) {
    case StatusCode::kCancelled: return parsyn::protocol::kTrainerExitStopped;
    case StatusCode::kResourceExhausted: return parsyn::protocol::kTrainerExitOutOfMemory;
    default: return parsyn::protocol::kTrainerExitFailed;
  }
}

int Usage() {
  std::cerr << "usage: parsyn-trainer --describe\n"
               "       parsyn-trainer run TASK.json\n"
               "       parsyn-trainer model-init DIR OPTIONS_JSON\n"
               "       parsyn-trainer tabular-init DIR OPTIONS_JSON\n"
               "       parsyn-trainer merge-adapter MODEL_DIR ADAPTER_DIR OUT_DIR\n";
  return parsyn::protocol::kTrainerExitUsage;
}

// SIGTERM/SIGINT become a stop request. The handler only writes a byte to a pipe (async-signal-safe, and it works
// whichever thread the signal lands on: libtorch may start threads before main); a watcher thread reads it and
// requests the stop, which the loop checks between micro-batches.
int g_signal_pipe[2] = {-1, -1};

void OnStopSignal(int) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe[1], &byte, 1);
}

void StartSignalWatcher(std::stop_source stop) {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return;  // without the pipe, signals keep their default action
  std::thread([stop]() mutable {
    char byte = 0;
    while (read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    stop.request_stop();
  }).detach();  // lives until the process exits
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int RunTask(const std::string& task_path, std::stop_token stop) {
  // The version first, so that a task file of another version is refused as such, whatever else it holds.
  const json task_json = json::parse(std::ifstream(task_path), nullptr, /*allow_exceptions=*/false);
  if (parsyn::Status version = parsyn::protocol::CheckTrainerContractVersion(task_json); !version.ok()) {
    return Fail(version, parsyn::protocol::kUnsupportedContractVersion);
  }
  auto task = parsyn::trainer::ReadTrainTaskFile(task_path);
  if (!task.ok()) return Fail(task.status());
  auto result = parsyn::trainer::RunTrainTask(*task, EmitLine, stop);
  if (!result.ok()) return Fail(result.status());
  json done = *result;
  done["event"] = "done";
  EmitLine(done);
  return 0;
}

parsyn::StatusOr<parsyn::trainer::ModelInitOptions> ParseInitOptions(const std::string& text) {
  parsyn::trainer::ModelInitOptions o;
  try {
    const json j = json::parse(text);
    if (!j.is_object()) return parsyn::InvalidArgumentError("model-init options: expected a JSON object");
    for (const auto& [key, value] : j.items()) {
      if (value.is_null()) continue;
      if (key == "architecture")
        o.architecture = value.get<std::string>();
      else if (key == "hidden_size")
        o.hidden_size = value.get<int64_t>();
      else if (key == "num_hidden_layers")
        o.num_hidden_layers = value.get<int64_t>();
      else if (key == "num_attention_heads")
        o.num_attention_heads = value.get<int64_t>();
      else if (key == "num_key_value_heads")
        o.num_key_value_heads = value.get<int64_t>();
      else if (key == "intermediate_size")
        o.intermediate_size = value.get<int64_t>();
      else if (key == "tokenizer_json")
        o.tokenizer_json = value.get<std::string>();
      else if (key == "vocab_size")
        o.vocab_size = value.get<int64_t>();
      else if (key == "tie_word_embeddings")
        o.tie_word_embeddings = value.get<bool>();
      else if (key == "max_position_embeddings")
        o.max_position_embeddings = value.get<int64_t>();
      else if (key == "rope_theta")
        o.rope_theta = value.get<double>();
      else if (key == "rms_norm_eps")
        o.rms_norm_eps = value.get<double>();
      else if (key == "seed")
        o.seed = value.get<uint64_t>();
      else if (key == "dtype") {
        PARSYN_ASSIGN_OR_RETURN(o.dtype, parsyn::weights::ParseDType(value.get<std::string>()));
      } else {
        return parsyn::InvalidArgumentError("model-init options: unknown key \"" + key + "\"");
      }
    }
  } catch (const json::exception& e) {
    return parsyn::InvalidArgumentError(std::string("model-init options: ") + e.what());
  }
  return o;
}

int ModelInit(const std::string& dir, const std::string& options_json) {
  auto options = ParseInitOptions(options_json);
  if (!options.ok()) return Fail(options.status());
  auto config = parsyn::trainer::InitModelFolder(dir, *options);
  if (!config.ok()) return Fail(config.status());
  EmitLine(json{{"event", "done"}, {"dir", dir}, {"config", json::parse(parsyn::trainer::LlamaConfigToJson(*config))}});
  return 0;
}

parsyn::Status InitTabularFolder(const std::string& dir, const std::string& options_json) {
  std::filesystem::path data;
  uint64_t seed = 0;
  json config_json = json::object();
  try {
    const json j = json::parse(options_json);
    if (!j.is_object()) return parsyn::InvalidArgumentError("tabular-init options: expected a JSON object");
    for (const auto& [key, value] : j.items()) {
      if (key == "data")
        data = value.get<std::string>();
      else if (key == "seed")
        seed = value.get<uint64_t>();
      else if (key == "config")
        config_json = value;
      else
        return parsyn::InvalidArgumentError("tabular-init options: unknown key \"" + key + "\"");
    }
  } catch (const json::exception& e) {
    return parsyn::InvalidArgumentError(std::string("tabular-init options: ") + e.what());
  }
  if (data.empty()) return parsyn::InvalidArgumentError("tabular-init options: \"data\" (a CSV file) is required");
  if (std::filesystem::exists(std::filesystem::path(dir) / parsyn::trainer::kTabularModelFile)) {
    return parsyn::AlreadyExistsError(dir + " already holds a " + parsyn::trainer::kTabularModelFile);
  }
  PARSYN_ASSIGN_OR_RETURN(const parsyn::protocol::TrainerConfig config,
                          parsyn::protocol::ParseTrainerConfig(config_json));
  parsyn::data::TabularOptions options;
  options.label_column = config.training.LabelColumn();
  auto dataset = parsyn::data::LoadTabularFile(data, options);
  if (!dataset.ok()) return dataset.status().WithContext(data.string());
  // No row list: the standardizer is fitted on every row of the file.
  PARSYN_ASSIGN_OR_RETURN(parsyn::trainer::TabularModelSpec spec,
                          parsyn::trainer::TabularSpecFor(config, *dataset, {}));
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<parsyn::trainer::TabularModel> model,
                          parsyn::trainer::TabularModel::Create(std::move(spec), seed, torch::kCPU));
  return model->Save(dir);
}

int TabularInit(const std::string& dir, const std::string& options_json) {
  if (parsyn::Status made = InitTabularFolder(dir, options_json); !made.ok()) return Fail(made);
  json spec =
      json::parse(std::ifstream(std::filesystem::path(dir) / parsyn::trainer::kTabularModelFile), nullptr, false);
  EmitLine(json{{"event", "done"}, {"dir", dir}, {"spec", spec}});
  return 0;
}

int MergeAdapter(const std::string& model_dir, const std::string& adapter_dir, const std::string& out_dir) {
  if (parsyn::Status merged = parsyn::trainer::MergeAdapterFolder(model_dir, adapter_dir, out_dir); !merged.ok()) {
    return Fail(merged);
  }
  const json config = json::parse(std::ifstream(std::filesystem::path(out_dir) / "config.json"), nullptr, false);
  EmitLine(json{{"event", "done"}, {"dir", out_dir}, {"dtype", config.value("torch_dtype", "")}, {"config", config}});
  return 0;
}

// One run of the program: `argv` as main gets it.
int RunCommand(const std::vector<std::string>& argv) {
  std::stop_source stop;
  StartSignalWatcher(stop);
  parsyn::log::Init();
  const size_t argc = argv.size();
  if (argc < 2) return Usage();
  const std::string& command = argv[1];
  if (command == "--describe" && argc == 2) {
    EmitLine(Description());
    return 0;
  }
  if (command == "run" && argc == 3) return RunTask(argv[2], stop.get_token());
  if (command == "model-init" && argc == 4) return ModelInit(argv[2], argv[3]);
  if (command == "tabular-init" && argc == 4) return TabularInit(argv[2], argv[3]);
  if (command == "merge-adapter" && argc == 5) return MergeAdapter(argv[2], argv[3], argv[4]);
  return Usage();
}

}  // namespace

int main(int argc, char** argv) {
  // Started by a worker with die_with_parent: never train on for a worker that was killed.
  parsyn::DieWithParentIfAsked();
  const std::vector<std::string> args(argv, argv + argc);
  // Before anything starts a thread: each run is a fork of this process as it is now.
  if (argc == 2 && args[1] == "--fork-server") return parsyn::ServeForks(STDIN_FILENO, RunCommand);
  const int code = RunCommand(args);
  // Without exit handlers, as a forked run ends (base/fork_server.h): libtorch's static destructors unregister every
  // operator, a cost each run would pay for nothing.
  std::fflush(nullptr);
  std::_Exit(code);
}
