#include "strategy/rdp_accountant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

namespace parsyn::strategy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kMaxFractionalTerms = 100000;
// A term this far (in log) below the running total no longer changes it (e^-36 ~ 2e-16): RDP values of 1e-5 (log A
// of small q and α) still come out to 1e-11 relative.
constexpr double kNegligibleLogRatio = 36.0;

constexpr std::array<double, 72> kDefaultOrders = [] {
  std::array<double, 72> orders{};
  const double small[] = {1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5};
  size_t n = 0;
  for (double o : small) orders[n++] = o;
  for (int o = 5; o <= 63; ++o) orders[n++] = o;
  for (double o : {128.0, 256.0, 512.0}) orders[n++] = o;
  return orders;
}();

// log(e^a + e^b)
double LogAdd(double a, double b) {
  if (a < b) std::swap(a, b);
  if (b == -kInf) return a;
  return a + std::log1p(std::exp(b - a));
}

// log(e^a - e^b) for a >= b; -inf when they are equal.
double LogSub(double a, double b) {
  if (b == -kInf) return a;
  if (a <= b) return -kInf;
  return a + std::log1p(-std::exp(b - a));
}

// log(erfc(x)), also where erfc(x) underflows.
double LogErfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  // Asymptotic series erfc(x) = e^(-x²) / (x √π) · (1 - 1/(2x²) + 3/(4x⁴) - 15/(8x⁶) + 105/(16x⁸) - ...); at x >= 25
  // the first omitted term is below 1e-12.
  const double r = 1 / (x * x);
  const double series = 1 - r / 2 + 3 * r * r / 4 - 15 * r * r * r / 8 + 105 * r * r * r * r / 16;
  return -x * x - std::log(x) - 0.5 * std::log(std::numbers::pi) + std::log(series);
}

// log(A_α) for integer α >= 2, 0 < q < 1: the binomial expansion, in log space. log C(α, i) is built up term by
// term (no lgamma: it writes a global in glibc).
double LogAInteger(double q, double sigma, int alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  double log_a = -kInf;
  double log_coef = 0;  // log C(α, 0)
  for (int i = 0; i <= alpha; ++i) {
    if (i > 0) log_coef += std::log(static_cast<double>(alpha - i + 1)) - std::log(static_cast<double>(i));
    const double di = i;
    const double term = log_coef + di * log_q + (alpha - di) * log_1mq + (di * di - di) / (2 * sigma * sigma);
    log_a = LogAdd(log_a, term);
  }
  return log_a;
}

// log(A_α) for fractional α > 1, 0 < q < 1 (MTZ19 §3.3): A_α = A0 + A1, the integrals below and above z0, each a
// series in the generalised binomial coefficients C(α, i), whose signs alternate once i > α + 1.
double LogAFractional(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double scale = std::numbers::sqrt2 * sigma;
  const double log_half = std::log(0.5);
  double pos0 = -kInf, neg0 = -kInf, pos1 = -kInf, neg1 = -kInf;
  double log_abs_coef = 0;  // log |C(α, i)|
  bool negative = false;    // sign of C(α, i)
  for (int i = 0; i < kMaxFractionalTerms; ++i) {
    if (i > 0) {
      const double factor = alpha - i + 1;
      if (factor < 0) negative = !negative;
      log_abs_coef += std::log(std::abs(factor)) - std::log(static_cast<double>(i));
    }
    const double di = i;
    const double j = alpha - di;
    const double log_s0 = log_abs_coef + di * log_q + j * log_1mq + (di * di - di) / (2 * sigma * sigma) + log_half +
                          LogErfc((di - z0) / scale);
    const double log_s1 = log_abs_coef + j * log_q + di * log_1mq + (j * j - j) / (2 * sigma * sigma) + log_half +
                          LogErfc((z0 - j) / scale);
    if (negative) {
      neg0 = LogAdd(neg0, log_s0);
      neg1 = LogAdd(neg1, log_s1);
    } else {
      pos0 = LogAdd(pos0, log_s0);
      pos1 = LogAdd(pos1, log_s1);
    }
    if (di > alpha + 1) {
      const double total = LogAdd(LogSub(pos0, neg0), LogSub(pos1, neg1));
      if (std::max(log_s0, log_s1) < total - kNegligibleLogRatio) return total;
    }
  }
  return kInf;  // did not converge: this order gives no bound
}

bool ValidRate(double q) { return q >= 0 && q <= 1; }
bool ValidNoise(double sigma) { return sigma >= 0 && !std::isinf(sigma); }  // NaN fails both comparisons
bool ValidDelta(double delta) { return delta > 0 && delta < 1; }

}  // namespace

std::span<const double> DefaultRdpOrders() { return kDefaultOrders; }

double SampledGaussianRdp(double q, double noise_multiplier, double order) {
  if (!ValidRate(q) || !ValidNoise(noise_multiplier) || !(order > 1) || std::isinf(order)) return kNaN;
  if (q == 0) return 0;
  if (noise_multiplier == 0) return kInf;
  if (q == 1) return order / (2 * noise_multiplier * noise_multiplier);
  const double log_a = order == std::floor(order) ? LogAInteger(q, noise_multiplier, static_cast<int>(order))
                                                  : LogAFractional(q, noise_multiplier, order);
  return log_a / (order - 1);
}

EpsilonAtOrder RdpToEpsilon(std::span<const double> orders, std::span<const double> rdp, double delta,
                            DpConversion conversion) {
  if (orders.size() != rdp.size() || orders.empty() || !ValidDelta(delta)) return {.epsilon = kNaN};
  EpsilonAtOrder best{.epsilon = kInf, .order = orders[0]};
  const double log_delta = std::log(delta);
  for (size_t k = 0; k < orders.size(); ++k) {
    const double a = orders[k];
    if (!(a > 1)) return {.epsilon = kNaN};
    double epsilon = conversion == DpConversion::kClassic
                         ? rdp[k] - log_delta / (a - 1)
                         : rdp[k] + std::log1p(-1 / a) - (log_delta + std::log(a)) / (a - 1);
    if (std::isnan(epsilon)) epsilon = kInf;
    if (epsilon < best.epsilon) best = {.epsilon = epsilon, .order = a};
  }
  best.epsilon = std::max(best.epsilon, 0.0);
  return best;
}

double EpsilonAfter(int64_t rounds, double q, double noise_multiplier, double delta, DpConversion conversion) {
  if (rounds < 0) return kNaN;
  RdpAccountant accountant;
  accountant.AddRounds(q, noise_multiplier, rounds);
  return accountant.Epsilon(delta, conversion).epsilon;
}

RdpAccountant::RdpAccountant(std::span<const double> orders)
    : orders_(orders.begin(), orders.end()), rdp_(orders.size(), 0.0) {}

void RdpAccountant::AddRounds(double q, double noise_multiplier, int64_t rounds) {
  if (rounds <= 0) return;
  if (q != cached_q_ || noise_multiplier != cached_noise_multiplier_ || cached_step_.size() != orders_.size()) {
    cached_step_.resize(orders_.size());
    for (size_t k = 0; k < orders_.size(); ++k) cached_step_[k] = SampledGaussianRdp(q, noise_multiplier, orders_[k]);
    cached_q_ = q;
    cached_noise_multiplier_ = noise_multiplier;
  }
  for (size_t k = 0; k < orders_.size(); ++k) rdp_[k] += static_cast<double>(rounds) * cached_step_[k];
  rounds_ += rounds;
}

bool RdpAccountant::Restore(std::span<const double> rdp, int64_t rounds) {
  if (rdp.size() != orders_.size() || rounds < 0) return false;
  rdp_.assign(rdp.begin(), rdp.end());
  rounds_ = rounds;
  return true;
}

EpsilonAtOrder RdpAccountant::Epsilon(double delta, DpConversion conversion) const {
  return RdpToEpsilon(orders_, rdp_, delta, conversion);
}

}  // namespace parsyn::strategy
