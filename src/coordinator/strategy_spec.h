// The job spec's `distributed.strategy_options` object: parsed per strategy into strategy::StrategyOptions, its
// cross-field rules, and its normalised JSON (docs/training.md "Strategies"). Pure functions; safe from any thread.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "strategy/strategy_options.h"

namespace parsyn::coordinator {

// Fills `out` with DefaultStrategyOptions(kind) and the options `object` gives (nullptr: none). Appends a problem
// per bad option, each naming its field: an option of another strategy is
//   "distributed.strategy_options.mu: fedadam does not take mu; it takes server_learning_rate, beta1, beta2, tau,
//    sample_fraction, sample_count"
// and an unknown key "unknown field distributed.strategy_options.<key>".
void ParseStrategyOptions(const nlohmann::json* object, strategy::StrategyKind kind, strategy::StrategyOptions& out,
                          std::vector<std::string>& errors);

// The rules between the options and the round sizes (every round has between min_workers and max_workers
// participants): krum and multi_krum need min_workers >= 2f + 3, multi_krum's m <= min_workers - f; sample_count
// within [min_workers, max_workers]; checked for a distributed job only. For any job, options the strategy class
// refuses (strategy::MakeStrategy) when the parser found nothing wrong.
void CheckStrategyRules(strategy::StrategyKind kind, const strategy::StrategyOptions& options, bool distributed,
                        int min_workers, int max_workers, std::vector<std::string>& errors);

// The normalised object: every option `kind` takes with its value (multi_krum's m null when unset: n - f), and
// sample_fraction or sample_count when given.
nlohmann::json StrategyOptionsToJson(strategy::StrategyKind kind, const strategy::StrategyOptions& options);

// Every strategy in the documented order (strategy::StrategyKinds) with the options it takes, in theirs, and each
// option's default as StrategyOptionsToJson writes it (null: none, as multi_krum's m, n - f when unset, or a required
// option's):
//   [{"name": "fedprox", "options": [{"name": "mu", "default": 0.01, "required": false}]}, ...]
// The dashboard's job form offers these (training_defaults_js.cc writes them into its training_defaults.js).
nlohmann::json StrategyCatalogJson();

}  // namespace parsyn::coordinator
