// Turns parsyn-trainer's JSON progress lines into what a person watches: a one-line bar redrawn in place on a
// terminal (steps, loss, learning rate, throughput, ETA), or a plain line every ~10% of the steps when stderr is not a
// terminal (logs, CI). Used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace parsyn::cli {

// "[#########-----------]  45/100  loss 1.2345  lr 2.00e-04  1.2k tokens/s  ETA 0:42" (bar `width` characters wide).
// `rate_unit` is "tokens/s" or "samples/s"; an ETA below 0 prints "ETA --". A NaN learning rate or rate (not known,
// e.g. `job watch` of a remote worker) leaves that part out, and so does an empty `rate_unit`: a rate is never shown
// without what it counts.
std::string FormatProgressLine(int64_t step, int64_t total_steps, double loss, double learning_rate, double rate,
                               const std::string& rate_unit, double eta_seconds, int width = 24);

// A number for people: a float with `decimals` decimals ("5.3639", not 5.363856935501099); an integer as it is; a
// string unquoted; null as "null".
std::string RoundedNumber(const nlohmann::json& value, int decimals = 4);

// The time left at the pace measured since the first step seen (which includes warm-up costs, so it is not counted):
// below 0 until two steps measure a pace. A step below the first seen starts again (a new task).
class StepPace {
 public:
  using Clock = std::chrono::steady_clock;
  double EtaSeconds(int64_t step, int64_t total_steps, Clock::time_point now);

 private:
  bool started_ = false;
  int64_t first_step_ = 0;
  Clock::time_point first_seen_;
};

// "[##########--------------]  12.3/45.6 MB  3.4 MB/s  ETA 0:10  model.safetensors": a file going up or down.
// `total_bytes` 0 (unknown) leaves out the bar's fill and the ETA; a NaN rate (not measured yet) the rate and ETA.
std::string FormatTransferLine(const std::string& label, uint64_t bytes, uint64_t total_bytes, double bytes_per_second,
                               int width = 24);

// A transfer's bar on `out` (stderr), redrawn in place at most ~10 times a second; nothing at all when not `enabled`
// (stderr is not a terminal and --progress was not given), so scripts and logs stay clean.
class TransferProgress {
 public:
  using Clock = std::chrono::steady_clock;
  TransferProgress(std::ostream& out, bool enabled, std::string label, uint64_t total_bytes);
  ~TransferProgress() { Finish(); }
  void Update(uint64_t bytes);
  // Draws the last state and ends the line (idempotent).
  void Finish();

 private:
  void Draw();
  std::ostream& out_;
  bool enabled_;
  std::string label_;
  uint64_t total_ = 0;
  uint64_t bytes_ = 0;
  bool open_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
};

class ProgressReporter {
 public:
  ProgressReporter(std::ostream& out, bool interactive);
  // Handles one trainer event ("start", "eval", "progress", "done"; others are ignored).
  void OnEvent(const nlohmann::json& event);
  // Ends a bar line still being redrawn (before printing an error after it).
  void Finish();

 private:
  std::ostream& out_;
  bool interactive_;
  bool bar_open_ = false;
  int64_t last_printed_step_ = 0;
  StepPace pace_;
};

}  // namespace parsyn::cli
