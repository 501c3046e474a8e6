// `parsyn simulate`'s engine: one federated job with N virtual workers on this machine, run by the real JobRunner
// (round engine, strategy, update checks, aggregation) on an in-process JobHost instead of the HTTP service.
//
// The output folder holds what a real coordinator stores, readable by the same code (`parsyn server --data-dir
// OUT --metadata OUT/parsyn.db --blobs OUT/blobs` serves it: rounds, metrics, events, artifacts):
//   OUT/parsyn.db      the SQLite metadata store (the dataset, the model, the virtual workers, the job)
//   OUT/blobs/         the directory blob store (dataset, model files, shards, every round's global and updates)
//   OUT/rounds.csv     one row per round attempt (round_report.h), OUT/rounds.json the same with the job's summary,
//   OUT/loss.svg       training and validation loss per round, a self-contained plot
//   OUT/global.safetensors  the last committed global
//
// Virtual workers: each is a worker record (kind "own", named sim-<i>) the job lists; a task the runner delivers to
// one runs on a pool of `parallel` threads, each running the trainer (parsyn-trainer, or any trainer of the trainer
// contract: docs/trainer-contract.md) as a child process through worker::TrainerSupervisor, as `parsyn worker` does
// (worker/task_translation.h builds the trainer's task), reading the round's global, its shard
// and the model straight from the blob store and writing its update there, then reporting the result to the runner
// as the worker protocol's routes do (coordinator::ToResultReport, JobRunner::Result / TaskFailed). A worker is
// offered to the job again once it has reported, as after a real worker's next poll.
//
// Threads: RunSimulation blocks its caller, which runs the event loop; the stores are called from a small pool,
// trainers from the `parallel` pool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "simulation/round_report.h"
#include "storage/metadata_store.h"
#include "worker/trainer_launcher.h"
#include "worker/trainer_supervisor.h"

namespace parsyn::simulation {

// Most virtual workers a simulation takes (the job spec's own limit on listed workers).
inline constexpr int kMaxVirtualWorkers = 10'000;

// What the event loop shows while the job runs (JobRunner::LiveView, plus the tasks done in the current round).
struct SimulationProgress {
  std::string phase;  // the runner's: "training", "aggregating", "final_evaluation", ...
  int round = 0;      // 0 during the final evaluation
  int total_rounds = 0;
  int committed_round = 0;
  int tasks_done = 0;                     // results (or failures) reported in this round so far
  int tasks_started = 0;                  // tasks delivered in this round so far
  std::optional<double> last_train_loss;  // the last committed round's (sample-weighted, as stored)
};

struct SimulationOptions {
  // The job: the same JSON body as POST /api/v1/training-jobs. dataset_id, model_id and worker_selection are set
  // here (the dataset, the model and the virtual workers below); data.source must be "platform".
  nlohmann::json job;
  std::filesystem::path data;          // the dataset file: .csv (tabular) or .jsonl (text)
  std::string label_column = "label";  // CSV: the column with each row's class (as POST /datasets' label_column)
  std::filesystem::path model_dir;     // a model folder (`parsyn model init`, or a Hugging Face folder)
  int workers = 10;                    // virtual workers, 1..kMaxVirtualWorkers
  int parallel = 1;                    // trainers run at once, >= 1
  worker::TrainerCommand trainer;      // runs every virtual worker's tasks (the job's config.trainer is not read)
  int trainer_threads = 1;             // each trainer's intra-op threads
  std::string device = "cpu";
  // Securely aggregated jobs only: each virtual worker's chance, in [0, 1], to drop out of each attempt in a phase
  // drawn at random (simulation/virtual_secure.h).
  double dropout = 0;
  // --speeds: "lognormal:SIGMA" or a file of step times (worker_speeds.h); empty: no virtual time. The round report
  // then gives each attempt's end in virtual time.
  std::string speeds;
  std::filesystem::path out;  // created if missing; must hold no earlier simulation (see the CLI's --force)
  std::function<void(const SimulationProgress&)> on_progress;  // on the loop thread, after each report and tick
};

struct SimulationResult {
  storage::TrainingJob job;           // as stored at the end (status, losses, best round)
  std::vector<std::string> warnings;  // the job's creation warnings, as POST /training-jobs answers them
  RoundReport report;                 // what rounds.csv / rounds.json hold
};

// Runs the job to its end and writes the folder above. InvalidArgument naming the option or the job's field (every
// problem the server would answer with a 400, "; "-separated) for bad input; the job's own failure (its rounds
// failed) is not an error here: see result.job.status and failure_reason.
StatusOr<SimulationResult> RunSimulation(const SimulationOptions& options, worker::TrainerLauncher& launcher);

}  // namespace parsyn::simulation
