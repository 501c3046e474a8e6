// The trainer contract's conformance probes (`parsyn trainer check`; docs/trainer-contract.md, "Conformance"): tasks
// that probe each rule of a trainer, run through the TrainerSupervisor the worker runs trainers with, each judged
// PASS or FAIL with what was seen.
//
// Without a model folder, the probes write a tabular MLP folder (the built-in trainer's layout) and synthetic CSV rows;
// with one, they use it and the given data file (CSV or JSONL), split 3:1 into training and validation rows. A LoRA
// model (config.json) is probed with fresh adapters as initial weights; any other folder with its model.safetensors.
//
// Threads: blocks its caller, which may run several checks at once in different work folders.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/trainer_supervisor.h"

namespace parsyn::worker {

struct ConformanceOptions {
  std::filesystem::path work_dir;   // created; probe files go here
  std::filesystem::path model_dir;  // empty: a generated tabular MLP
  std::filesystem::path data;       // required with model_dir: a .csv or .jsonl file
  std::chrono::seconds task_timeout{
      300};  // each probe task's deadline (the SIGTERM probe's task never ends on its own)
};

struct ProbeResult {
  std::string probe;  // "describe", "train", "evaluate", "zero_steps", "wrong_layout", "nan_loss", "sigterm",
                      // "unknown_version"
  bool passed = false;
  std::string detail;  // what was seen; for a FAIL, which rule and why
};

// Runs every probe in the contract's order. Errors only for a check that cannot be set up (InvalidArgument naming the
// option: a missing data file, a model folder without weights); a trainer that misbehaves gives FAIL results.
StatusOr<std::vector<ProbeResult>> RunConformanceProbes(TrainerLauncher& launcher, const TrainerCommand& trainer,
                                                        const ConformanceOptions& options);

}  // namespace parsyn::worker
