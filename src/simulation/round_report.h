// The per-round table of a finished (or running) job, built from the metadata store exactly as stored, and the three
// files `parsyn simulate` writes from it: rounds.csv, rounds.json and loss.svg (a self-contained SVG line plot of the
// training and validation loss per round, viewable in any browser).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::simulation {

// One round attempt, committed or failed.
struct RoundRow {
  int round = 0;
  int attempt = 0;
  std::string status;  // "committed" | "failed" | "running"
  int participants = 0;
  int accepted_updates = 0;
  int rejected_updates = 0;
  int64_t samples = 0;                    // the accepted updates' sample counts, summed
  std::optional<double> train_loss;       // as stored: sample-weighted mean of the workers' training losses
  std::optional<double> validation_loss;  // of the global this round committed
  int64_t bytes_moved = 0;                // bytes_down + bytes_up
  int64_t bytes_down = 0;                 // the globals the workers read
  int64_t bytes_up = 0;                   // the updates they wrote, as encoded
  int64_t duration_ms = 0;                // ended - started (0 while running)
  std::string global_sha256;              // committed rounds only
  std::string failure_reason;
  std::optional<double> virtual_time_s;  // --speeds: the attempt's end in virtual time (worker_speeds.h)
};

struct RoundReport {
  int64_t job_id = 0;
  std::string job_status;
  std::string failure_reason;
  std::string strategy;
  int workers = 0;
  std::optional<double> initial_validation_loss;
  std::optional<double> final_validation_loss;
  std::optional<int> best_round;
  std::string final_global_sha256;  // the last committed round's global; empty when none committed
  std::vector<RoundRow> rows;       // by round, then attempt
};

// Reads the job, its rounds and their updates from the store. Blocking. `step_seconds` (worker id -> virtual
// seconds per step; empty: none) gives each attempt's virtual end (VirtualEnds over the job's steps_per_round).
// `measured_ends`: each attempt's virtual end as the simulation measured it, (round, attempt) -> seconds (an
// asynchronous job's, whose results arrived in virtual-time order); when given it is used instead of step_seconds.
StatusOr<RoundReport> ReadRoundReport(storage::MetadataStore& store, int64_t job_id, int workers,
                                      const std::map<int64_t, double>& step_seconds = {},
                                      const std::map<std::pair<int, int>, double>& measured_ends = {});

// round,attempt,status,participants,accepted_updates,rejected_updates,samples,train_loss,validation_loss,
// bytes_moved,bytes_down,bytes_up,duration_ms,global_sha256,failure_reason,virtual_time_s — a header line, then one
// line per row; an unknown loss or virtual time is an empty field, numbers in full precision (%.17g), text quoted as
// RFC 4180 says when it needs to be.
std::string RoundReportCsv(const RoundReport& report);
// {"job_id", "status", "failure_reason", "strategy", "workers", "initial_validation_loss", "final_validation_loss",
//  "best_round", "final_global_sha256", "rounds": [{the CSV's columns by name; null for an unknown loss}]}
nlohmann::json RoundReportJson(const RoundReport& report);
// Loss per round: training loss of each committed round, validation loss of each committed global (the starting
// weights' at round 0), as polylines with axes, ticks and a legend.
std::string RoundReportSvg(const RoundReport& report);

// Writes rounds.csv, rounds.json and loss.svg into `dir`.
Status WriteRoundReport(const RoundReport& report, const std::filesystem::path& dir);

}  // namespace parsyn::simulation
