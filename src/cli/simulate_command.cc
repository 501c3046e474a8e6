// parsyn simulate --job job.json --data FILE --model DIR --workers N --out DIR [--parallel P] [--threads T]
//                 [--label-column C] [--device D] [--trainer COMMAND] [--dropout P] [--speeds S] [--force]
//                 [--log-level L]
//                 [--output text|json]
// One federated job with N virtual workers on this machine, through the real round engine, strategy and trainer,
// without a server (src/simulation/simulation.h; docs/simulate.md). A round bar on stderr; at the end a summary
// (text) or the rounds.json document (json) on stdout. Exit 0 when the job succeeded (or stopped early), 1 otherwise,
// 2 for bad input.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "cli/trainer_runner.h"
#include "simulation/simulation.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct SimulateFlags {
  std::string job_file;
  std::string data;
  std::string model;
  std::string out;
  std::string label_column = "label";
  std::string device = "cpu";
  std::string log_level;
  std::string output = "text";
  std::string trainer;  // a command line; empty: parsyn-trainer
  int workers = 10;
  double dropout = 0;  // securely aggregated jobs: each virtual worker's chance to drop out of each attempt
  std::string speeds;  // lognormal:SIGMA or a file of step times: virtual time per round
  int parallel = 0;    // 0: one trainer per core
  int threads = 1;
  bool force = false;
};

// The files an earlier simulation left in --out (removed by --force; nothing else there is touched).
constexpr const char* kOutputs[] = {"parsyn.db",   "parsyn.db-wal", "parsyn.db-shm",     "blobs", "work", "rounds.csv",
                                    "rounds.json", "loss.svg",      "global.safetensors"};

// The round bar: "[######------]  2/3  loss 0.4123  ETA 0:12" redrawn in place on a terminal, else one line per round.
class RoundBar {
 public:
  explicit RoundBar(bool interactive) : interactive_(interactive) {}
  void Update(const simulation::SimulationProgress& p) {
    const int done = p.committed_round;
    const double loss = p.last_train_loss.value_or(std::nan(""));
    const double eta = done > 0 ? pace_.EtaSeconds(done, p.total_rounds, StepPace::Clock::now()) : -1;
    std::string line = FormatProgressLine(done, p.total_rounds, loss, std::nan(""), std::nan(""), "", eta);
    if (p.round > 0) {
      line += "  round " + std::to_string(p.round) + ": " + std::to_string(p.tasks_done) + "/" +
              std::to_string(p.tasks_started) + " workers reported";
    } else if (p.phase == "final_evaluation") {
      line += "  final evaluation";
    }
    if (interactive_) {
      std::cerr << "\r\033[K" << line << std::flush;
      open_ = true;
    } else if (done != last_printed_) {
      std::cerr << line << "\n";
      last_printed_ = done;
    }
  }
  void Finish() {
    if (open_) std::cerr << "\n";
    open_ = false;
  }

 private:
  bool interactive_;
  bool open_ = false;
  int last_printed_ = 0;
  StepPace pace_;
};

StatusOr<json> ReadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("--job " + path + ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("--job " + path + ": not a JSON object (the body of POST /api/v1/training-jobs)");
  }
  return j;
}

int RunSimulate(const SimulateFlags& f) {
  if (!f.log_level.empty()) {
    log::Init(f.log_level);
  } else if (std::getenv("PARSYN_LOG_LEVEL") == nullptr) {
    log::Init("warn");  // the runner's per-round lines would break the bar; the files hold every round
  }
  StatusOr<json> job = ReadJobFile(f.job_file);
  if (!job.ok()) return Fail("simulate", job.status().message(), 2);
  std::error_code ec;
  if (fs::exists(f.out / fs::path("parsyn.db"))) {
    if (!f.force) {
      return Fail("simulate", "--out " + f.out + " already holds a simulation (use --force to replace it)", 2);
    }
    for (const char* name : kOutputs) fs::remove_all(fs::path(f.out) / name, ec);
  }
  simulation::SimulationOptions options{
      .job = std::move(*job),
      .data = f.data,
      .label_column = f.label_column,
      .model_dir = f.model,
      .workers = f.workers,
      .parallel = f.parallel > 0 ? f.parallel : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
      .trainer_threads = f.threads,
      .device = f.device,
      .dropout = f.dropout,
      .speeds = f.speeds,
      .out = f.out};
  if (f.trainer.empty()) {
    StatusOr<fs::path> builtin = FindTrainer();
    if (!builtin.ok()) return Fail("simulate", builtin.status().message());
    options.trainer = {.name = "builtin", .argv = {builtin->string()}};
  } else {
    StatusOr<worker::TrainerCommand> trainer = worker::ParseTrainerCommand("simulated=" + f.trainer);
    if (!trainer.ok()) return Fail("simulate", "--trainer: " + trainer.status().message(), 2);
    options.trainer = std::move(*trainer);
  }
  RoundBar bar(isatty(STDERR_FILENO) != 0);
  options.on_progress = [&bar](const simulation::SimulationProgress& p) { bar.Update(p); };
  worker::ProcessTrainerLauncher launcher;
  if (f.trainer.empty()) launcher.ForkRunsOf(options.trainer.argv[0]);  // parsyn-trainer: one start for every run
  StatusOr<simulation::SimulationResult> result = simulation::RunSimulation(options, launcher);
  bar.Finish();
  if (!result.ok()) {
    return Fail("simulate", result.status().message(), result.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
  }
  for (const std::string& w : result->warnings) std::cerr << "parsyn simulate: warning: " << w << "\n";
  const simulation::RoundReport& report = result->report;
  if (f.output == "json") {
    std::cout << simulation::RoundReportJson(report).dump(2) << "\n";
  } else {
    std::cout << "job " << report.job_id << " " << report.job_status << " (" << report.strategy << ", "
              << report.workers << " virtual workers)";
    if (!report.failure_reason.empty()) std::cout << ": " << report.failure_reason;
    std::cout << "\n";
    for (const simulation::RoundRow& r : report.rows) {
      std::cout << "  round " << r.round << " attempt " << r.attempt << " " << r.status << ": " << r.accepted_updates
                << " updates, train loss " << RoundedNumber(r.train_loss ? json(*r.train_loss) : json())
                << ", validation loss " << RoundedNumber(r.validation_loss ? json(*r.validation_loss) : json()) << "\n";
    }
    std::cout << "wrote " << (fs::path(f.out) / "rounds.csv").string() << ", rounds.json, loss.svg"
              << (report.final_global_sha256.empty() ? "" : ", global.safetensors") << " and the job's store ("
              << (fs::path(f.out) / "parsyn.db").string() << ", blobs/)\n";
  }
  const storage::JobStatus status = result->job.status;
  return status == storage::JobStatus::kSucceeded || status == storage::JobStatus::kStopped ? 0 : 1;
}

}  // namespace

void AddSimulateCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Run a federated job with N virtual workers on this machine (no server): pick a strategy");
  cmd->add_option("--job,-j", flags->job_file,
                  "The job as JSON: the body of POST /api/v1/training-jobs (dataset_id, model_id and "
                  "worker_selection are set by simulate)")
      ->required();
  cmd->add_option("--data,-d", flags->data, "The dataset: .csv (tabular) or .jsonl (text)")->required();
  cmd->add_option("--model,-m", flags->model,
                  "Model folder (`parsyn model init`, or config.json + model.safetensors + tokenizer.json)")
      ->required();
  cmd->add_option("--workers,-n", flags->workers, "Virtual workers")->capture_default_str();
  cmd->add_option("--out,-o", flags->out,
                  "Output folder: the job's store (parsyn.db, blobs/), rounds.csv, rounds.json, loss.svg, "
                  "global.safetensors")
      ->required();
  cmd->add_option("--parallel,-p", flags->parallel, "Trainers run at once (0: one per CPU core)")
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads, "CPU threads per trainer")->capture_default_str();
  cmd->add_option("--label-column", flags->label_column, "CSV: the column holding each row's class")
      ->capture_default_str();
  cmd->add_option("--device", flags->device, "cpu, cuda or cuda:N (every trainer)")->capture_default_str();
  cmd->add_option("--trainer", flags->trainer,
                  "the trainer command every virtual worker runs (docs/trainer-contract.md; default: parsyn-trainer)");
  cmd->add_option("--dropout", flags->dropout,
                  "Securely aggregated jobs: each virtual worker's chance (0..1) to drop out of each attempt, in a "
                  "phase drawn at random (after advertising its keys, after sharing them, or after its masked input)")
      ->capture_default_str();
  cmd->add_option(
      "--speeds", flags->speeds,
      "Virtual workers of unequal speeds: lognormal:SIGMA (step times exp(SIGMA z) s, median 1 s) or a file "
      "with one step time in seconds per worker; rounds.csv's virtual_time_s then says when each attempt "
      "would have ended");
  cmd->add_flag("--force", flags->force, "Replace an earlier simulation's files in --out");
  cmd->add_option("--log-level", flags->log_level, "debug, info, warn or error (default: warn)");
  cmd->add_option("--output", flags->output, "text (a summary) or json (rounds.json) on stdout")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->callback([flags, &exit_code] { exit_code = RunSimulate(*flags); });
}

}  // namespace parsyn::cli
