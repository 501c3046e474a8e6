// bench_rounds' trainer run (rounds_trainers.cc): the round time of real `parsyn worker`s whose trainer is an external
// program of the trainer contract against the built-in parsyn-trainer's, in one run.
#pragma once

#include <filesystem>
#include <string>

namespace parsyn::bench {

// Runs the same federated tabular job twice on a fresh `parsyn server` (`parsyn_bin`) under `root`: K workers with
// parsyn-trainer, then K workers whose "builtin" is a tiny Python trainer that writes its update at once; prints
// each run's rounds and the ratio of the median round times (external / built-in) against the 1.2 target, with
// PASS/MISS. `rounds` >= 2 (the first round, which fetches the model and shards, is not in the median).
void RunTrainerRounds(const std::string& parsyn_bin, const std::filesystem::path& root, int workers, int rounds);

}  // namespace parsyn::bench
