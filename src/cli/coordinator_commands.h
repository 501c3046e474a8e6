// The coordinator's subcommands of `parsyn` (one file per group; see commands.h for the exit-code convention):
//   parsyn server                                                   server_command.cc
//   parsyn job create|list|get|watch|stop|cancel|download          job_commands.cc
//   parsyn dataset upload|list|get                                  dataset_commands.cc
//   parsyn model upload|list|get                                    model_commands.cc
//   parsyn worker register|list|get                                 worker_commands.cc
//   parsyn audit export|verify|key                                  audit_commands.cc
//   parsyn user create|list|get, parsyn key create|list|revoke      user_commands.cc
//   parsyn login                                                    login_command.cc
#pragma once

#include <CLI/CLI.hpp>

namespace parsyn::cli {

void AddServerCommand(CLI::App& app, int& exit_code);
void AddJobCommands(CLI::App& app, int& exit_code);
void AddDatasetCommands(CLI::App& app, int& exit_code);
void AddModelRemoteCommands(CLI::App& app, int& exit_code);
void AddWorkerRegisterCommands(CLI::App& app, int& exit_code);
void AddAuditCommands(CLI::App& app, int& exit_code);
void AddUserCommands(CLI::App& app, int& exit_code);
void AddProjectCommands(CLI::App& app, int& exit_code);
void AddLoginCommand(CLI::App& app, int& exit_code);

}  // namespace parsyn::cli
