// parsyn trainer check --trainer COMMAND [--model DIR --data FILE] [--work-dir DIR]
// Runs a trainer through the trainer contract's conformance probes (worker/trainer_conformance.h;
// docs/trainer-contract.md, "Conformance") and prints one line per probe: "PASS probe: what was seen" or
// "FAIL probe: the rule and why". Exit 0 when every probe passes, 1 when one fails, 2 for bad input.
// --trainer builtin (or nothing) checks parsyn-trainer.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/trainer_runner.h"
#include "worker/trainer_conformance.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

struct CheckFlags {
  std::string trainer = "builtin";
  std::string model;
  std::string data;
  std::string work_dir;
};

int RunCheck(const CheckFlags& f) {
  auto fail = [](const std::string& message, int code) {
    std::cerr << "parsyn trainer check: " << message << "\n";
    return code;
  };
  worker::TrainerCommand trainer;
  if (f.trainer == "builtin") {
    StatusOr<fs::path> builtin = FindTrainer();
    if (!builtin.ok()) return fail(builtin.status().message(), 1);
    trainer = {.name = "builtin", .argv = {builtin->string()}};
  } else {
    StatusOr<worker::TrainerCommand> parsed = worker::ParseTrainerCommand("checked=" + f.trainer);
    if (!parsed.ok()) return fail("--trainer: " + parsed.status().message(), 2);
    trainer = std::move(*parsed);
  }
  // A work folder of its own unless one is given; removed afterwards only when it was made here.
  const bool own_work_dir = f.work_dir.empty();
  const fs::path work_dir = own_work_dir
                                ? fs::temp_directory_path() / ("parsyn-trainer-check-" + std::to_string(getpid()))
                                : fs::path(f.work_dir);
  worker::ProcessTrainerLauncher launcher;
  std::cout << "checking " << trainer.CommandLine() << " against the trainer contract, version "
            << protocol::kTrainerContractVersion << std::endl;
  StatusOr<std::vector<worker::ProbeResult>> results =
      worker::RunConformanceProbes(launcher, trainer, {.work_dir = work_dir, .model_dir = f.model, .data = f.data});
  std::error_code ec;
  if (own_work_dir) fs::remove_all(work_dir, ec);
  if (!results.ok()) return fail(results.status().message(), 2);
  int failed = 0;
  for (const worker::ProbeResult& r : *results) {
    std::cout << (r.passed ? "PASS " : "FAIL ") << r.probe << ": " << r.detail << std::endl;
    if (!r.passed) ++failed;
  }
  std::cout << results->size() - failed << " passed, " << failed << " failed" << std::endl;
  return failed == 0 ? 0 : 1;
}

}  // namespace

void AddTrainerCommands(CLI::App& app, int& exit_code) {
  CLI::App* group = app.add_subcommand("trainer", "work with trainers (docs/trainer-contract.md)");
  group->require_subcommand(1);
  auto flags = std::make_shared<CheckFlags>();
  CLI::App* check = group->add_subcommand("check", "run a trainer through the trainer contract's conformance probes");
  check->add_option("--trainer", flags->trainer, "the trainer's command line, or builtin for parsyn-trainer")
      ->capture_default_str();
  check->add_option("--model", flags->model,
                    "a model folder to probe with (default: a generated tabular MLP); needs --data");
  check->add_option("--data", flags->data, "a .csv or .jsonl file of rows for --model");
  check->add_option("--work-dir", flags->work_dir, "where the probes' files go (kept; default: a temporary folder)");
  check->callback([flags, &exit_code] { exit_code = RunCheck(*flags); });
}

}  // namespace parsyn::cli
