// Heterogeneous virtual workers for `parsyn simulate --speeds`: each virtual worker's time per training step, in
// virtual seconds, from which the round report gives each attempt's virtual end (rounds.csv's virtual_time_s). The
// trainers still run as fast as this machine runs them: virtual time says how long the job would take on workers of
// these speeds without waiting for it.
//
// A round attempt lasts, in virtual time, as long as its slowest participant: steps_per_round times the largest step
// time among the workers it assigned (a synchronous round waits for each). Attempts follow each other.
// Pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"

namespace parsyn::simulation {

// The step time of each of `workers` virtual workers, in order, from `spec`:
//   "lognormal:SIGMA"  exp(SIGMA z) seconds with z a standard normal drawn from `seed` and the worker's index: a median
//                      of 1 s per step and a spread of SIGMA (>= 0; 0: all equal);
//   a file's path      one positive number of seconds per line for each worker in order (blank lines and lines
//                      starting with # are skipped; exactly `workers` numbers).
// InvalidArgument naming what is wrong (the spec, SIGMA, the file's line, the count).
StatusOr<std::vector<double>> ParseWorkerSpeeds(const std::string& spec, int workers, uint64_t seed);

// Each attempt's virtual end, in order: `attempts` lists each attempt's participants (worker ids); `step_seconds`
// maps a worker id to its step time (a participant not in it: InvalidArgument). Cumulative sums of
// steps_per_round x the slowest participant's step time.
StatusOr<std::vector<double>> VirtualEnds(const std::vector<std::vector<int64_t>>& attempts,
                                          const std::map<int64_t, double>& step_seconds, int64_t steps_per_round);

// An asynchronous job's virtual time (distributed.aggregation "async"): no round waits, so the order in which results
// reach the coordinator is what the speeds decide. A task started at virtual time t on a worker of step time s ends at
// t + steps_per_task * s; its trainer's real-time result is held (Finished) until no task still training would end
// before it in virtual time, then released in virtual-end order (ties: by worker id), and the virtual clock moves to
// its end; tasks that start meanwhile start at that time. Deterministic whatever the real trainers' timing.
class VirtualSchedule {
 public:
  VirtualSchedule(std::map<int64_t, double> step_seconds, int64_t steps_per_task)
      : step_seconds_(std::move(step_seconds)), steps_per_task_(steps_per_task) {}

  // The worker starts a task now; its virtual end. A worker without a step time takes 0 s.
  double Start(int64_t worker);
  // The worker's task finished in real time (a result or a failure to report): held until released.
  void Finished(int64_t worker);
  // The held worker whose result goes to the coordinator next, once no task still training ends before it (and the
  // clock at its end); nullopt while there is none.
  std::optional<int64_t> Release();
  double now() const { return now_; }

 private:
  std::map<int64_t, double> step_seconds_;
  int64_t steps_per_task_ = 0;
  double now_ = 0;
  std::map<int64_t, double> training_;         // worker -> virtual end, trainer still running
  std::set<std::pair<double, int64_t>> held_;  // (virtual end, worker): finished, not released yet
};

}  // namespace parsyn::simulation
