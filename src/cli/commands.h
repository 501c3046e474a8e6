// The `parsyn` program's subcommand groups. Each group lives in its own file and registers itself on the root app;
// a command's callback stores the process exit code in `exit_code` (0 success, 1 failure, 2 usage; trainer-backed
// commands pass on parsyn-trainer's 3 = stopped, 4 = out of memory).
// Errors are printed to stderr as one line "parsyn <command>: <reason>".
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <string_view>

namespace parsyn::cli {

// Prints "parsyn <command>: <message>" to stderr and returns `code`, the exit code a command's callback stores.
inline int Fail(std::string_view command, std::string_view message, int code = 1) {
  std::cerr << "parsyn " << command << ": " << message << "\n";
  return code;
}

// parsyn train: local single-machine training (train_command.cc).
void AddTrainCommand(CLI::App& app, int& exit_code);
// parsyn model init (model_command.cc).
void AddModelCommands(CLI::App& app, int& exit_code);
// parsyn adapter merge (adapter_command.cc).
void AddAdapterCommands(CLI::App& app, int& exit_code);
// parsyn worker --server URL --token TOKEN ...: the worker agent (worker_command.cc).
void AddWorkerCommand(CLI::App& app, int& exit_code);
// parsyn simulate: a federated job with N virtual workers on this machine, no server (simulate_command.cc).
void AddSimulateCommand(CLI::App& app, int& exit_code);
// parsyn trainer check: a trainer against the trainer contract's conformance probes (trainer_command.cc).
void AddTrainerCommands(CLI::App& app, int& exit_code);
// parsyn demo: server, workers and a federated job on this machine (demo_command.cc).
void AddDemoCommand(CLI::App& app, int& exit_code);
// parsyn completion bash|zsh: a completion script generated from `app`'s commands (completion_command.cc). Register
// it on the root app; it walks the app when it runs, so every command is in it.
void AddCompletionCommand(CLI::App& app, int& exit_code);

}  // namespace parsyn::cli
