// Small dense linear algebra in double precision for the LoRA rank tools (lora_rank.h): column-major matrices, a
// Householder thin QR and a one-sided (Hestenes) Jacobi SVD. Written here rather than taken from LAPACK or Eigen:
// the matrices are tall-thin (4096 x 64) or tiny (64 x 64), the code is short, and its arithmetic is fixed, so a
// result is bit-identical on every run and thread count (no blocked kernels that pick their order by CPU or size).
//
// Every loop runs in a fixed order; Dot sums four interleaved partial sums combined in a fixed order. All functions
// are pure and safe to call from several threads at once on different matrices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parsyn::weights::linalg {

// A column-major matrix: element (i, j) at data[i + j * rows], so a column is contiguous.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;

  Matrix() = default;
  Matrix(int64_t num_rows, int64_t num_cols)
      : rows(num_rows), cols(num_cols), data(static_cast<size_t>(num_rows * num_cols), 0.0) {}
  double& operator()(int64_t i, int64_t j) { return data[static_cast<size_t>(i + j * rows)]; }
  double operator()(int64_t i, int64_t j) const { return data[static_cast<size_t>(i + j * rows)]; }
  double* col(int64_t j) { return data.data() + j * rows; }
  const double* col(int64_t j) const { return data.data() + j * rows; }
};

// sum_i x[i] * y[i] over n elements, in a fixed order.
double Dot(const double* x, const double* y, int64_t n);
// y[i] += a * x[i].
void Axpy(double a, const double* x, double* y, int64_t n);

// a * b^T: (a.rows x a.cols) times (b.cols x b.rows); a.cols must equal b.cols.
Matrix MultiplyTransposed(const Matrix& a, const Matrix& b);

// Householder QR of an m x n matrix A = Q R with k = min(m, n): Q is m x k with orthonormal columns (a product of k
// reflectors, so its columns are orthonormal to rounding even when A is rank-deficient or zero), R is k x n upper
// trapezoidal. For j < k, the first j + 1 columns of Q span the first j + 1 columns of A when those are independent.
class HouseholderQr {
 public:
  explicit HouseholderQr(Matrix a);

  int64_t rows() const { return factors_.rows; }
  int64_t k() const { return static_cast<int64_t>(tau_.size()); }
  // R: k x n.
  Matrix R() const;
  // Q x for x of k rows: an m x x.cols matrix, computed by applying the reflectors to [x; 0] (Q is never formed).
  Matrix ApplyQ(const Matrix& x) const;

 private:
  Matrix factors_;  // R on and above the diagonal, the reflectors' vectors below it (their leading 1 implicit)
  std::vector<double> tau_;
};

// The SVD of a p x q matrix M as M V = W: V is q x q orthogonal and W's columns are orthogonal, so the singular
// values are W's column norms and W = U diag(sigma) (U is not formed: callers want U diag(sigma), and a zero sigma
// has no defined column of U). Columns are sorted by sigma descending, ties kept in index order. One-sided Jacobi:
// sweeps rotate each column pair (i < j) in order until a sweep rotates none (or after a fixed bound of sweeps).
struct JacobiSvdResult {
  Matrix w;                   // p x q
  Matrix v;                   // q x q
  std::vector<double> sigma;  // q values, descending
};
JacobiSvdResult JacobiSvd(Matrix m);

}  // namespace parsyn::weights::linalg
