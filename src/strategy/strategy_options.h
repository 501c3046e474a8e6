// StrategyKind and StrategyOptions: which aggregation policy a job uses and its typed options, as the job spec's
// `distributed.strategy` and `distributed.strategy_options` give them (the coordinator parses the JSON and fills this
// struct; docs/training.md "Strategies" lists the formulas, options and defaults). Pure data; safe from any thread.
#pragma once

#include <optional>
#include <span>
#include <string_view>

namespace parsyn::strategy {

enum class StrategyKind {
  kFederatedAveraging,
  kFedProx,
  kFedAvgM,
  kFedAdam,
  kFedYogi,
  kFedAdagrad,
  kMedian,
  kTrimmedMean,
  kKrum,
  kMultiKrum,
  kDpFedAvg,
};

// Every kind with its job-spec spelling ("federated_averaging", "fedprox", ...), in the documented order.
struct StrategyKindSpelling {
  std::string_view name;
  StrategyKind kind;
};
std::span<const StrategyKindSpelling> StrategyKinds();
std::string_view StrategyKindName(StrategyKind kind);

// Client sampling, for any strategy: at most one of the two is set. See ChooseParticipants (strategy/sampling.h).
struct Sampling {
  std::optional<double> fraction;  // (0, 1]: ceil(fraction * available) workers, within [min_workers, max_workers]
  std::optional<int> count;        // >= 1: that many workers, within [min_workers, max_workers]

  friend bool operator==(const Sampling&, const Sampling&) = default;
};

// The options of every strategy; a kind reads only its own (StrategyOptionNames), the others keep their zero value.
// DefaultStrategyOptions(kind) fills a kind's defaults.
struct StrategyOptions {
  // fedprox: the proximal term's weight, mu/2 * ||w - w_global||^2 added to each worker's loss. The coordinator puts
  // it in the workers' task messages; aggregation is FedAvg's. 0 for every other kind.
  double mu = 0;
  // fedavgm, fedadam, fedyogi, fedadagrad (server optimizers over the pseudo-gradient).
  double server_learning_rate = 0;
  double server_momentum = 0;  // fedavgm
  double beta1 = 0;            // fedadam, fedyogi, fedadagrad
  double beta2 = 0;            // fedadam, fedyogi
  double tau = 0;              // fedadam, fedyogi, fedadagrad
  // trimmed_mean: the fraction trimmed at each end, 0 <= beta < 0.5.
  double beta = 0;
  // krum, multi_krum: the number of Byzantine workers tolerated, and (multi_krum) how many updates are averaged;
  // m unset: n - f, n the round's accepted updates.
  int f = 0;
  std::optional<int> m;
  // dp_fedavg: per-update L2 clipping bound (required), Gaussian noise stddev = noise_multiplier * clip_norm (on the
  // sum), and the delta for which epsilon is reported.
  double clip_norm = 0;
  double noise_multiplier = 0;
  double delta = 0;
  // dp_fedavg under secure aggregation: the workers clip and add the noise (DpFedAvgOptions::noise_from_workers). Set
  // by the coordinator for a securely aggregated job, never read from a job spec.
  bool noise_from_workers = false;
  Sampling sampling;

  friend bool operator==(const StrategyOptions&, const StrategyOptions&) = default;
};

// The option names a kind takes, besides sample_fraction and sample_count (which every kind takes), in documented
// order: {"server_learning_rate", "beta1", "beta2", "tau"} for fedadam.
std::span<const std::string_view> StrategyOptionNames(StrategyKind kind);
// The kind's defaults (docs/training.md): fedadam {server_learning_rate 0.1, beta1 0.9, beta2 0.99, tau 1e-9}, ...
// dp_fedavg's clip_norm has no default (0 here: the job spec requires it).
StrategyOptions DefaultStrategyOptions(StrategyKind kind);
// Whether the job spec must give `option` for `kind`: it has no default (dp_fedavg's clip_norm).
bool StrategyOptionRequired(StrategyKind kind, std::string_view option);

}  // namespace parsyn::strategy
