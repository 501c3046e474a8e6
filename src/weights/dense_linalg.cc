#include "weights/dense_linalg.h"

#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <utility>

namespace parsyn::weights::linalg {

double Dot(const double* x, const double* y, int64_t n) {
  // Four partial sums: independent chains the CPU can overlap (and the compiler pair into vectors), combined in a
  // fixed order so the result does not depend on anything but x, y and n.
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i] * y[i];
    s1 += x[i + 1] * y[i + 1];
    s2 += x[i + 2] * y[i + 2];
    s3 += x[i + 3] * y[i + 3];
  }
  for (; i < n; ++i) s0 += x[i] * y[i];
  return (s0 + s1) + (s2 + s3);
}

void Axpy(double a, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

Matrix MultiplyTransposed(const Matrix& a, const Matrix& b) {
  assert(a.cols == b.cols);
  Matrix out(a.rows, b.rows);
  for (int64_t j = 0; j < b.rows; ++j) {
    for (int64_t l = 0; l < a.cols; ++l) {
      const double blj = b(j, l);
      if (blj != 0) Axpy(blj, a.col(l), out.col(j), a.rows);
    }
  }
  return out;
}

HouseholderQr::HouseholderQr(Matrix a) : factors_(std::move(a)) {
  const int64_t m = factors_.rows;
  const int64_t n = factors_.cols;
  const int64_t k = std::min(m, n);
  tau_.assign(static_cast<size_t>(k), 0.0);
  for (int64_t j = 0; j < k; ++j) {
    double* x = factors_.col(j) + j;  // the column from the diagonal down: x[0] is A(j, j)
    const int64_t len = m - j;
    const double alpha = x[0];
    const double tail = Dot(x + 1, x + 1, len - 1);
    if (tail == 0) continue;  // already zero below the diagonal: H = I (tau 0), R(j, j) = alpha
    // LAPACK's dlarfg: H = I - tau v v^T with v = (1, x[1:] / (alpha - beta)) maps x to (beta, 0, ..., 0); beta takes
    // the sign opposite to alpha so alpha - beta does not cancel.
    const double norm = std::sqrt(alpha * alpha + tail);
    const double beta = alpha <= 0 ? norm : -norm;
    const double tau = (beta - alpha) / beta;
    const double scale = 1.0 / (alpha - beta);
    for (int64_t i = 1; i < len; ++i) x[i] *= scale;
    x[0] = beta;
    tau_[static_cast<size_t>(j)] = tau;
    for (int64_t c = j + 1; c < n; ++c) {
      double* y = factors_.col(c) + j;
      const double s = tau * (y[0] + Dot(x + 1, y + 1, len - 1));
      y[0] -= s;
      Axpy(-s, x + 1, y + 1, len - 1);
    }
  }
}

Matrix HouseholderQr::R() const {
  const int64_t k = this->k();
  Matrix r(k, factors_.cols);
  for (int64_t c = 0; c < factors_.cols; ++c) {
    for (int64_t i = 0; i <= std::min(c, k - 1); ++i) r(i, c) = factors_(i, c);
  }
  return r;
}

Matrix HouseholderQr::ApplyQ(const Matrix& x) const {
  const int64_t m = factors_.rows;
  const int64_t k = this->k();
  assert(x.rows == k);
  Matrix y(m, x.cols);
  for (int64_t c = 0; c < x.cols; ++c) std::copy(x.col(c), x.col(c) + k, y.col(c));
  // Q = H_0 H_1 ... H_{k-1}: the last reflector acts first.
  for (int64_t j = k - 1; j >= 0; --j) {
    const double tau = tau_[static_cast<size_t>(j)];
    if (tau == 0) continue;
    const double* v = factors_.col(j) + j;  // v[0] = 1 implicitly; v[1:] stored
    const int64_t len = m - j;
    for (int64_t c = 0; c < x.cols; ++c) {
      double* t = y.col(c) + j;
      const double s = tau * (t[0] + Dot(v + 1, t + 1, len - 1));
      t[0] -= s;
      Axpy(-s, v + 1, t + 1, len - 1);
    }
  }
  return y;
}

namespace {

// Rotates columns i and j of `w` (and of `v`) so they become orthogonal; false when they already are, to within
// the tolerance, and nothing was changed.
bool RotatePair(Matrix& w, Matrix& v, int64_t i, int64_t j) {
  constexpr double kTolerance = 4 * DBL_EPSILON;
  double* wi = w.col(i);
  double* wj = w.col(j);
  const double alpha = Dot(wi, wi, w.rows);
  const double beta = Dot(wj, wj, w.rows);
  const double gamma = Dot(wi, wj, w.rows);
  if (gamma == 0 || std::abs(gamma) <= kTolerance * std::sqrt(alpha) * std::sqrt(beta)) return false;
  // The rotation that diagonalises [[alpha, gamma], [gamma, beta]] (Rutishauser's formulas): the smaller angle.
  const double zeta = (beta - alpha) / (2 * gamma);
  const double t = std::abs(zeta) > 1e150 ? 1 / (2 * zeta)
                                          : std::copysign(1.0, zeta) / (std::abs(zeta) + std::sqrt(1 + zeta * zeta));
  const double c = 1 / std::sqrt(1 + t * t);
  const double s = c * t;
  auto rotate = [c, s](double* x, double* y, int64_t n) {
    for (int64_t r = 0; r < n; ++r) {
      const double xr = x[r];
      const double yr = y[r];
      x[r] = c * xr - s * yr;
      y[r] = s * xr + c * yr;
    }
  };
  rotate(wi, wj, w.rows);
  rotate(v.col(i), v.col(j), v.rows);
  return true;
}

}  // namespace

JacobiSvdResult JacobiSvd(Matrix m) {
  constexpr int kMaxSweeps = 100;  // quadratic convergence takes ~10 for the sizes here; the bound only ends a loop
  const int64_t q = m.cols;
  Matrix w = std::move(m);
  Matrix v(q, q);
  for (int64_t i = 0; i < q; ++i) v(i, i) = 1;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool rotated = false;
    for (int64_t i = 0; i < q; ++i) {
      for (int64_t j = i + 1; j < q; ++j) rotated |= RotatePair(w, v, i, j);
    }
    if (!rotated) break;
  }
  std::vector<double> norms(static_cast<size_t>(q));
  for (int64_t j = 0; j < q; ++j) norms[static_cast<size_t>(j)] = std::sqrt(Dot(w.col(j), w.col(j), w.rows));
  std::vector<int64_t> order(static_cast<size_t>(q));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return norms[static_cast<size_t>(a)] > norms[static_cast<size_t>(b)]; });
  JacobiSvdResult out{Matrix(w.rows, q), Matrix(q, q), std::vector<double>(static_cast<size_t>(q))};
  for (int64_t j = 0; j < q; ++j) {
    const int64_t from = order[static_cast<size_t>(j)];
    std::copy(w.col(from), w.col(from) + w.rows, out.w.col(j));
    std::copy(v.col(from), v.col(from) + q, out.v.col(j));
    out.sigma[static_cast<size_t>(j)] = norms[static_cast<size_t>(from)];
  }
  return out;
}

}  // namespace parsyn::weights::linalg
