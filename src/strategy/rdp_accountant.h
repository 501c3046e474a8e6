// Privacy accounting for dp_fedavg: Rényi differential privacy (RDP, Mironov 2017) of the sampled Gaussian
// mechanism (Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism"), composed
// over rounds and converted to (ε, δ)-DP. The same analysis as TF-Privacy's and Opacus's RDP accountants.
//
// One round is one use of the mechanism: every participant's clipped update is summed and Gaussian noise of standard
// deviation noise_multiplier * clip_norm is added; each eligible worker takes part with probability q (Poisson
// sampling, add/remove-one-worker neighbours). RDP at order α of one round (A_α of MTZ19 §3):
//   q = 1: α / (2σ²) exactly (the plain Gaussian mechanism);   q = 0: 0;   σ = 0: +∞.
//   integer α: log(Σ_{i=0..α} C(α,i) q^i (1-q)^(α-i) exp((i²-i)/(2σ²))) / (α-1), summed in log space;
//   fractional α: the two-sided series of MTZ19 §3.3 (terms with erfc, split at z0 = σ² log(1/q - 1) + 1/2),
//   summed until a term is below e^-36 of the total (an order whose series does not converge in 100000 terms is
//   +∞, i.e. left out of the minimum).
// Rounds compose by adding RDP per order. Conversion to ε at δ, minimised over the orders:
//   kClassic  (Mironov 2017, Prop. 3):                  ε = RDP(α) - log(δ) / (α-1)
//   kImproved (Canonne, Kamath, Steinke 2020, Prop. 12; Balle et al. 2020, Thm. 21; what Opacus and Google's
//              dp_accounting use): ε = RDP(α) + log(1 - 1/α) - (log(δ) + log(α)) / (α-1), never above kClassic.
// ε is clamped at 0 from below. Pure functions and a value class; no I/O, no global state (safe from any thread;
// one RdpAccountant is used by one thread at a time).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace parsyn::strategy {

enum class DpConversion { kClassic, kImproved };

// The orders of Google's dp_accounting (TF-Privacy's successor) and Opacus's defaults:
// 1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, 5, 6, ..., 63, 128, 256, 512.
std::span<const double> DefaultRdpOrders();

// RDP at `order` (> 1) of one round of the sampled Gaussian mechanism with sampling rate q (in [0, 1]) and noise
// multiplier σ (>= 0). NaN if an argument is out of range.
double SampledGaussianRdp(double q, double noise_multiplier, double order);

struct EpsilonAtOrder {
  double epsilon = 0;  // +∞ when no order gives a finite bound (e.g. σ = 0)
  double order = 0;    // the order that gave the minimum
};

// ε at δ (in (0, 1)) from per-order RDP values (rdp.size() == orders.size()). NaN epsilon if an argument is out of
// range.
EpsilonAtOrder RdpToEpsilon(std::span<const double> orders, std::span<const double> rdp, double delta,
                            DpConversion conversion = DpConversion::kImproved);

// ε after `rounds` rounds with the same q and σ, at δ, over DefaultRdpOrders().
double EpsilonAfter(int64_t rounds, double q, double noise_multiplier, double delta,
                    DpConversion conversion = DpConversion::kImproved);

// Incremental accounting: add each round as it happens (rounds may differ in q), ask ε at any time.
class RdpAccountant {
 public:
  explicit RdpAccountant(std::span<const double> orders = DefaultRdpOrders());

  // Adds `rounds` rounds (>= 0) of the sampled Gaussian mechanism with rate q and multiplier σ. The per-order RDP of
  // the last (q, σ) is cached, so a job whose rate does not change computes it once.
  void AddRounds(double q, double noise_multiplier, int64_t rounds = 1);

  EpsilonAtOrder Epsilon(double delta, DpConversion conversion = DpConversion::kImproved) const;

  int64_t rounds() const { return rounds_; }
  const std::vector<double>& orders() const { return orders_; }
  // The composed RDP, per order.
  const std::vector<double>& rdp() const { return rdp_; }

  // For a resumed job: replaces the composed RDP and the round count by values rdp() and rounds() gave (e.g. stored
  // with a committed round), so ε comes out bit for bit as before. False (nothing changed) if rdp.size() differs from
  // orders().size() or rounds < 0.
  bool Restore(std::span<const double> rdp, int64_t rounds);

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
  int64_t rounds_ = 0;
  double cached_q_ = -1;
  double cached_noise_multiplier_ = -1;
  std::vector<double> cached_step_;
};

}  // namespace parsyn::strategy
