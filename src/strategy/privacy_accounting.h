// What a differentially private strategy accounts (DpFedAvg, strategy/dp_fed_avg.h): its options and each round's
// report, which Strategy::CommittedRoundPrivacy hands to the job runner without it naming the strategy.
// Pure data; safe from any thread.
#pragma once

namespace parsyn::strategy {

// dp_fedavg's options, checked by ValidateDpFedAvgOptions (strategy/dp_fed_avg.h).
struct DpFedAvgOptions {
  double clip_norm = 1.0;         // C: the L2 bound of each update's delta; finite, > 0
  double noise_multiplier = 1.0;  // σ: noise standard deviation / C; finite, >= 0 (0: clipping only, ε = +∞)
  double delta = 1e-5;            // δ of the reported (ε, δ); in (0, 1), ideally below 1 / eligible workers
  // Distributed DP (a securely aggregated job, where the coordinator sees only the sum): each worker clips its own
  // delta to C and adds its share of the noise (secagg::ClipAndAddNoise), so the mean handed to FinishFromMean is
  // already clipped and noisy and FinishFromMean adds no noise. The accountant is the same.
  bool noise_from_workers = false;
};

// What the last finished round did (for the round's record and the API).
struct DpRoundReport {
  int round = 0;
  int participants = 0;      // K, updates in the aggregate
  int clipped = 0;           // of them, how many had ‖Δ‖ > clip_norm
  double noise_stddev = 0;   // per coordinate of the average: σ·C/K
  double sampling_rate = 1;  // q = K / eligible workers (1 when the eligible count is unknown)
  double epsilon = 0;        // ε at options.delta after this round (all rounds so far)
};

// A committed round's report with the options it was accounted under (the round_committed event's "privacy").
struct RoundPrivacy {
  DpRoundReport round;
  DpFedAvgOptions options;
};

}  // namespace parsyn::strategy
