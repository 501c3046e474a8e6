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

}  // namespace parsyn::simulation
