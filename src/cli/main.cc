// parsyn: the user-facing program (docs/architecture.md §1). Subcommands register themselves from one file per group
// (commands.h); torch work runs in parsyn-trainer, which this program starts as a child process.
#include <CLI/CLI.hpp>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/coordinator_commands.h"

int main(int argc, char** argv) {
  parsyn::log::Init();
  CLI::App app{"Parsyn: federated training of language models and tabular models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "parsyn 0.1.0");
  int exit_code = 0;
  parsyn::cli::AddTrainCommand(app, exit_code);
  parsyn::cli::AddModelCommands(app, exit_code);
  parsyn::cli::AddAdapterCommands(app, exit_code);
  parsyn::cli::AddServerCommand(app, exit_code);
  parsyn::cli::AddJobCommands(app, exit_code);
  parsyn::cli::AddDatasetCommands(app, exit_code);
  parsyn::cli::AddModelRemoteCommands(app, exit_code);
  parsyn::cli::AddWorkerRegisterCommands(app, exit_code);
  parsyn::cli::AddWorkerCommand(app, exit_code);
  parsyn::cli::AddDemoCommand(app, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
