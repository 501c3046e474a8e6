// parsyn: the user-facing program (docs/architecture.md §1). Subcommands register themselves from one file per group
// (commands.h); torch work runs in parsyn-trainer, which this program starts as a child process.
#include <CLI/CLI.hpp>
#include <iostream>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/coordinator_commands.h"

namespace {

// Usage errors (unknown flag or subcommand, missing or bad value) exit 2, not with CLI11's own codes (105-109...),
// after CLI11's message and where to read the command's usage (commands.h): "parsyn job create: ...".
int ReportUsageError(const CLI::App& app, const CLI::ParseError& error) {
  std::string command = "parsyn";
  const CLI::App* current = &app;  // the deepest subcommand the parser had entered when it stopped
  while (!current->get_subcommands().empty()) {
    current = current->get_subcommands().front();
    command += " " + current->get_name();
  }
  std::string message = error.what();
  // CLI11 says only "A subcommand is required" when the word given is not one of them: name it.
  const std::vector<std::string> left = current->remaining();
  if (current->get_require_subcommand_min() > 0 && current->get_subcommands().empty() && !left.empty() &&
      !left.front().starts_with("-")) {
    message = "unknown command '" + left.front() + "'";
  }
  std::cerr << command << ": " << message << "\n"
            << "Run '" << command << " --help' for usage.\n";
  return 2;
}

}  // namespace

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
  parsyn::cli::AddAuditCommands(app, exit_code);
  parsyn::cli::AddUserCommands(app, exit_code);
  parsyn::cli::AddProjectCommands(app, exit_code);
  parsyn::cli::AddLoginCommand(app, exit_code);
  parsyn::cli::AddWorkerCommand(app, exit_code);
  parsyn::cli::AddDemoCommand(app, exit_code);
  parsyn::cli::AddSimulateCommand(app, exit_code);
  parsyn::cli::AddTrainerCommands(app, exit_code);
  parsyn::cli::AddCompletionCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    // Every usage error exits 2 (commands.h), not CLI11's own codes, with a pointer to the command's help.
    return ReportUsageError(app, e);
  }
  return exit_code;
}
