#include "weights/lora_rank.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/build_paths.h"
#include "base/testing/temp_dir.h"
#include "weights/dense_linalg.h"
#include "weights/safetensors.h"

namespace parsyn::weights {
namespace {

using linalg::Matrix;

struct Module {
  std::string prefix;
  int64_t out;
  int64_t in;
};

std::string AName(const std::string& prefix) { return prefix + ".lora_A.weight"; }
std::string BName(const std::string& prefix) { return prefix + ".lora_B.weight"; }

// Adds a tensor whose flat element j is value(j), rounded to `dtype`.
template <typename Fn>
void AddTensor(WeightSet& set, const std::string& name, DType dtype, std::vector<int64_t> shape, Fn value) {
  StatusOr<std::span<std::byte>> bytes = set.AddZeros(name, dtype, std::move(shape));
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const Tensor& t = set[set.size() - 1];
  for (int64_t j = 0; j < t.numel(); ++j) StoreElement(t, j, value(j));
}

// An adapter of rank r over `modules` (normal values; B zero when zero_b), then a non-LoRA "norm.weight" of 16.
WeightSet RandomAdapter(std::mt19937& rng, const std::vector<Module>& modules, int64_t r, DType dtype,
                        bool zero_b = false) {
  std::normal_distribution<double> normal(0.0, 1.0);
  WeightSet set;
  for (const Module& m : modules) {
    AddTensor(set, AName(m.prefix), dtype, {r, m.in}, [&](int64_t) { return normal(rng); });
    AddTensor(set, BName(m.prefix), dtype, {m.out, r}, [&](int64_t) { return zero_b ? 0.0 : normal(rng); });
  }
  AddTensor(set, "norm.weight", dtype, {16}, [&](int64_t) { return normal(rng); });
  return set;
}

const std::vector<Module>& SmallModules() {
  static const std::vector<Module> modules = {{"m.0.q_proj", 24, 16}, {"m.0.down_proj", 16, 40}, {"m.1.v", 33, 17}};
  return modules;
}

// A stored tensor as a column-major matrix of its values, widened to double.
Matrix ToMatrix(const Tensor& t) {
  Matrix m(t.shape[0], t.shape[1]);
  for (int64_t i = 0; i < m.rows; ++i) {
    for (int64_t j = 0; j < m.cols; ++j) m(i, j) = LoadElement(t, i * m.cols + j);
  }
  return m;
}

Matrix Transposed(const Matrix& m) {
  Matrix t(m.cols, m.rows);
  for (int64_t i = 0; i < m.rows; ++i) {
    for (int64_t j = 0; j < m.cols; ++j) t(j, i) = m(i, j);
  }
  return t;
}

// B A (out x in) of one pair, in double from the stored values.
Matrix Product(const WeightSet& set, const std::string& prefix) {
  return linalg::MultiplyTransposed(ToMatrix(*set.Find(BName(prefix))), Transposed(ToMatrix(*set.Find(AName(prefix)))));
}

double MaxAbs(const Matrix& m) {
  double worst = 0;
  for (double v : m.data) worst = std::max(worst, std::abs(v));
  return worst;
}

double MatrixMaxAbsDiff(const Matrix& a, const Matrix& b) {
  double worst = 0;
  for (size_t i = 0; i < a.data.size(); ++i) worst = std::max(worst, std::abs(a.data[i] - b.data[i]));
  return worst;
}

double SquaredFrobenius(const Matrix& a, const Matrix& b) {
  double sum = 0;
  for (size_t i = 0; i < a.data.size(); ++i) sum += (a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
  return sum;
}

// max |A A^T - I| over the rows of a lora_A tensor.
double OrthonormalityError(const Tensor& a) {
  const Matrix at = Transposed(ToMatrix(a));  // in x r: the rows of A as columns
  double worst = 0;
  for (int64_t i = 0; i < at.cols; ++i) {
    for (int64_t j = 0; j < at.cols; ++j) {
      worst = std::max(worst, std::abs(linalg::Dot(at.col(i), at.col(j), at.rows) - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

bool SameBytes(const WeightSet& a, const WeightSet& b) {
  if (!a.CheckSameLayout(b).ok()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (std::memcmp(a[t].data.data(), b[t].data.data(), a[t].data.size()) != 0) return false;
  }
  return true;
}

void ExpectInvalid(const Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "'" << s.message() << "' lacks '" << needle << "'";
}

TEST(LoraRankTest, RankOfAnAdapter) {
  std::mt19937 rng(1);
  StatusOr<int64_t> rank = LoraRank(RandomAdapter(rng, SmallModules(), 4, DType::kBF16));
  ASSERT_TRUE(rank.ok()) << rank.status().ToString();
  EXPECT_EQ(*rank, 4);
}

TEST(LoraRankTest, RankErrorsNameTheTensorAndTheNumbers) {
  auto zeros = [](int64_t) { return 0.0; };
  struct Case {
    std::string what;
    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"no pairs", {{"norm.weight", {4}}}, "no LoRA pair"},
      {"A without B", {{"x.lora_A.weight", {2, 4}}}, "'x.lora_A.weight' has no 'x.lora_B.weight'"},
      {"B without A", {{"x.lora_B.weight", {4, 2}}}, "'x.lora_B.weight' has no 'x.lora_A.weight'"},
      {"3-D", {{"x.lora_A.weight", {2, 4, 1}}, {"x.lora_B.weight", {4, 2}}}, "expected 2 dimensions"},
      {"A and B disagree", {{"x.lora_A.weight", {2, 4}}, {"x.lora_B.weight", {4, 3}}}, "has rank 3"},
      {"pairs differ",
       {{"x.lora_A.weight", {2, 4}},
        {"x.lora_B.weight", {4, 2}},
        {"y.lora_A.weight", {3, 4}},
        {"y.lora_B.weight", {4, 3}}},
       "'y.lora_A.weight' has rank 3, 'x.lora_A.weight' has rank 2"},
      {"rank 0", {{"x.lora_A.weight", {0, 4}}, {"x.lora_B.weight", {4, 0}}}, "has rank 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WeightSet set;
    for (const auto& [name, shape] : c.tensors) AddTensor(set, name, DType::kF32, shape, zeros);
    ExpectInvalid(LoraRank(set).status(), c.needle);
  }
  WeightSet ints;
  AddTensor(ints, "x.lora_A.weight", DType::kI32, {2, 4}, zeros);
  AddTensor(ints, "x.lora_B.weight", DType::kI32, {4, 2}, zeros);
  ExpectInvalid(LoraRank(ints).status(), "has dtype I32");
}

TEST(LoraRankTest, LayoutUpToRank) {
  std::mt19937 rng(2);
  const WeightSet global = RandomAdapter(rng, SmallModules(), 8, DType::kF32);
  for (int64_t r : {1, 3, 8}) {
    StatusOr<int64_t> got = CheckLoraLayoutUpToRank(global, RandomAdapter(rng, SmallModules(), r, DType::kF32));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, r);
  }
  ExpectInvalid(CheckLoraLayoutUpToRank(global, RandomAdapter(rng, SmallModules(), 16, DType::kF32)).status(),
                "update's 'm.0.q_proj.lora_A.weight' has rank 16, above the job's maximum rank 8");
  ExpectInvalid(CheckLoraLayoutUpToRank(global, RandomAdapter(rng, SmallModules(), 4, DType::kBF16)).status(),
                "has dtype BF16, expected F32");
  std::vector<Module> wider = SmallModules();
  wider[1].in = 41;
  ExpectInvalid(CheckLoraLayoutUpToRank(global, RandomAdapter(rng, wider, 4, DType::kF32)).status(),
                "'m.0.down_proj.lora_A.weight' has shape [4, 41], expected [4, 40]");
  std::vector<Module> fewer = SmallModules();
  fewer.pop_back();
  ExpectInvalid(CheckLoraLayoutUpToRank(global, RandomAdapter(rng, fewer, 4, DType::kF32)).status(),
                "'m.1.v.lora_A.weight'");
  // Mixed ranks inside one update: the second pair at rank 2, the first at 4.
  WeightSet mixed = RandomAdapter(rng, {SmallModules()[0]}, 4, DType::kF32);
  WeightSet rest = RandomAdapter(rng, {SmallModules()[1], SmallModules()[2]}, 2, DType::kF32);
  WeightSet joined;
  for (const WeightSet* s : {&mixed, &rest}) {
    for (const Tensor& t : s->tensors()) {
      if (t.name == "norm.weight" && s == &mixed) continue;
      ASSERT_TRUE(joined.Add(t.name, t.dtype, t.shape, t.data).ok());
    }
  }
  ExpectInvalid(CheckLoraLayoutUpToRank(global, joined).status(),
                "update's 'm.0.down_proj.lora_A.weight' has rank 2, its 'm.0.q_proj.lora_A.weight' has rank 4");
  WeightSet bad_norm = RandomAdapter(rng, SmallModules(), 4, DType::kF32);
  WeightSet no_pairs;
  AddTensor(no_pairs, "norm.weight", DType::kF32, {16}, [](int64_t) { return 0.0; });
  ExpectInvalid(CheckLoraLayoutUpToRank(no_pairs, bad_norm).status(), "global: no LoRA pair");
}

TEST(LoraRankTest, PadAndSlice) {
  std::mt19937 rng(3);
  WeightSet adapter = RandomAdapter(rng, SmallModules(), 3, DType::kBF16);
  adapter.metadata()["format"] = "pt";
  StatusOr<WeightSet> padded = ZeroPadLoraRank(adapter, 5);
  ASSERT_TRUE(padded.ok()) << padded.status().ToString();
  EXPECT_EQ(padded->metadata(), adapter.metadata());
  for (const Module& m : SmallModules()) {
    const Tensor& a = *padded->Find(AName(m.prefix));
    const Tensor& b = *padded->Find(BName(m.prefix));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{5, m.in}));
    EXPECT_EQ(b.shape, (std::vector<int64_t>{m.out, 5}));
    for (int64_t j = 3 * m.in; j < 5 * m.in; ++j) EXPECT_EQ(LoadElement(a, j), 0.0);
    for (int64_t o = 0; o < m.out; ++o) {
      for (int64_t c = 0; c < 5; ++c) {
        const double want = c < 3 ? LoadElement(*adapter.Find(BName(m.prefix)), o * 3 + c) : 0.0;
        EXPECT_EQ(LoadElement(b, o * 5 + c), want);
      }
    }
    EXPECT_EQ(MatrixMaxAbsDiff(Product(*padded, m.prefix), Product(adapter, m.prefix)), 0.0);
  }
  StatusOr<WeightSet> back = SliceLoraRank(*padded, 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(SameBytes(*back, adapter));
  EXPECT_EQ(back->metadata(), adapter.metadata());
  StatusOr<WeightSet> first = SliceLoraRank(adapter, 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const Tensor& b1 = *first->Find(BName("m.1.v"));
  EXPECT_EQ(b1.shape, (std::vector<int64_t>{33, 1}));
  EXPECT_EQ(LoadElement(b1, 7), LoadElement(*adapter.Find(BName("m.1.v")), 7 * 3));
  EXPECT_TRUE(SameBytes(*ZeroPadLoraRank(adapter, 3), adapter));

  ExpectInvalid(ZeroPadLoraRank(adapter, 2).status(), "of rank 3 to the lower rank 2");
  ExpectInvalid(SliceLoraRank(adapter, 0).status(), "to rank 0");
  ExpectInvalid(SliceLoraRank(adapter, 4).status(), "of rank 3 to rank 4");
  ExpectInvalid(TruncateLoraRank(adapter, 4).status(), "of rank 3 to rank 4");
}

// The rank-r truncation is the first r ranks of the full one, bit for bit: a worker of rank r starts from exactly the
// ranks that the rest of the global's SVD form completes (strategy::RoundAggregation, the coordinator's rank globals).
TEST(LoraRankTest, TruncationIsTheFirstRanksOfTheFullTruncation) {
  std::mt19937 rng(8);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const WeightSet adapter = RandomAdapter(rng, SmallModules(), 5, dtype);
    const WeightSet full = *TruncateLoraRank(adapter, 5);
    for (int64_t r = 1; r < 5; ++r) EXPECT_TRUE(SameBytes(*TruncateLoraRank(adapter, r), *SliceLoraRank(full, r))) << r;
  }
}

// Scaling the products multiplies B alone; a scale that is not finite and > 0 is refused.
TEST(LoraRankTest, ScalingTheProductsScalesB) {
  std::mt19937 rng(6);
  const WeightSet adapter = RandomAdapter(rng, SmallModules(), 2, DType::kF32);
  StatusOr<WeightSet> scaled = ScaleLoraProducts(adapter, 0.25);
  ASSERT_TRUE(scaled.ok()) << scaled.status().ToString();
  for (const Module& m : SmallModules()) {
    EXPECT_TRUE(std::equal(scaled->Find(AName(m.prefix))->data.begin(), scaled->Find(AName(m.prefix))->data.end(),
                           adapter.Find(AName(m.prefix))->data.begin()));
    const Tensor& b = *scaled->Find(BName(m.prefix));
    for (int64_t i = 0; i < b.numel(); ++i) {
      EXPECT_EQ(LoadElement(b, i), 0.25 * LoadElement(*adapter.Find(BName(m.prefix)), i));
    }
  }
  ExpectInvalid(ScaleLoraProducts(adapter, 0).status(), "finite and > 0");
  ExpectInvalid(ScaleLoraProducts(adapter, std::nan("")).status(), "finite and > 0");
}

// A lower-rank adapter completed from a donor: its own ranks, then the donor's beyond them; an adapter trained from
// nothing but the donor's first ranks (its slice) comes back as the donor itself, byte for byte.
TEST(LoraRankTest, ExtendTakesTheRanksTheAdapterLacksFromTheDonor) {
  std::mt19937 rng(5);
  const WeightSet donor = RandomAdapter(rng, SmallModules(), 5, DType::kF32);
  WeightSet trained = RandomAdapter(rng, SmallModules(), 2, DType::kF32);
  StatusOr<WeightSet> whole = ExtendLoraRank(*SliceLoraRank(donor, 2), donor);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(SameBytes(*whole, donor));
  StatusOr<WeightSet> extended = ExtendLoraRank(trained, donor);
  ASSERT_TRUE(extended.ok()) << extended.status().ToString();
  for (const Module& m : SmallModules()) {
    const Tensor& a = *extended->Find(AName(m.prefix));
    const Tensor& b = *extended->Find(BName(m.prefix));
    ASSERT_EQ(a.shape, (std::vector<int64_t>{5, m.in}));
    ASSERT_EQ(b.shape, (std::vector<int64_t>{m.out, 5}));
    for (int64_t l = 0; l < 5; ++l) {
      const WeightSet& from = l < 2 ? trained : donor;
      const int64_t rank = l < 2 ? 2 : 5;
      EXPECT_EQ(LoadElement(a, l * m.in + 1), LoadElement(*from.Find(AName(m.prefix)), l * m.in + 1)) << l;
      EXPECT_EQ(LoadElement(b, 3 * 5 + l), LoadElement(*from.Find(BName(m.prefix)), 3 * rank + l)) << l;
    }
  }
  ExpectInvalid(ExtendLoraRank(donor, trained).status(), "rank 5");
}

// Eckart-Young: the squared error of the rank-r truncation is the sum of the discarded squared singular values of
// B A, here from a Jacobi SVD of the dense product. F64 factors, so only double rounding is in the comparison.
TEST(LoraRankTest, TruncationErrorIsTheDiscardedSingularValues) {
  std::mt19937 rng(4);
  const WeightSet adapter = RandomAdapter(rng, SmallModules(), 8, DType::kF64);
  for (int64_t r : {1, 3, 7}) {
    SCOPED_TRACE("r = " + std::to_string(r));
    StatusOr<WeightSet> truncated = TruncateLoraRank(adapter, r);
    ASSERT_TRUE(truncated.ok()) << truncated.status().ToString();
    for (const Module& m : SmallModules()) {
      const Matrix dense = Product(adapter, m.prefix);
      const std::vector<double> sigma = linalg::JacobiSvd(dense).sigma;
      double discarded = 0;
      for (size_t j = static_cast<size_t>(r); j < sigma.size(); ++j) discarded += sigma[j] * sigma[j];
      const double error = SquaredFrobenius(dense, Product(*truncated, m.prefix));
      EXPECT_NEAR(error, discarded, 1e-10 * sigma[0] * sigma[0]) << m.prefix;
      EXPECT_GT(discarded, 1e-3 * sigma[0] * sigma[0]);  // the case is not trivial
      EXPECT_LT(OrthonormalityError(*truncated->Find(AName(m.prefix))), 1e-12);
    }
    EXPECT_TRUE(SameBytes(*truncated, *TruncateLoraRank(adapter, r, {.num_threads = 1})));
  }
}

// At full rank the product is kept: F32 factors, each rounded once to F32 (unit roundoff u = 2^-24); with A's rows
// orthonormal, |error| <= 2u sum_l |B'_ol||A'_li| <= 2u ||B'_o|| <= 2u sqrt(in) max|BA| (7.5e-7 for in <= 40).
TEST(LoraRankTest, TruncationToFullRankKeepsTheProduct) {
  std::mt19937 rng(5);
  const WeightSet adapter = RandomAdapter(rng, SmallModules(), 6, DType::kF32);
  StatusOr<WeightSet> full = TruncateLoraRank(adapter, 6);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  for (const Module& m : SmallModules()) {
    const Matrix dense = Product(adapter, m.prefix);
    EXPECT_LE(MatrixMaxAbsDiff(dense, Product(*full, m.prefix)), 1e-6 * MaxAbs(dense)) << m.prefix;
    EXPECT_LT(OrthonormalityError(*full->Find(AName(m.prefix))), 1e-6);
  }
  EXPECT_EQ(std::memcmp(full->Find("norm.weight")->data.data(), adapter.Find("norm.weight")->data.data(), 64), 0);
}

// A fresh PEFT adapter has B = 0: the truncation keeps B' = 0 and gives A' orthonormal rows spanning A's first r.
TEST(LoraRankTest, TruncatingAZeroBGivesAnOrthonormalBasisOfAsFirstRows) {
  std::mt19937 rng(6);
  const WeightSet adapter = RandomAdapter(rng, SmallModules(), 8, DType::kF32, /*zero_b=*/true);
  StatusOr<WeightSet> truncated = TruncateLoraRank(adapter, 3);
  ASSERT_TRUE(truncated.ok()) << truncated.status().ToString();
  for (const Module& m : SmallModules()) {
    SCOPED_TRACE(m.prefix);
    EXPECT_EQ(MaxAbs(ToMatrix(*truncated->Find(BName(m.prefix)))), 0.0);
    const Tensor& a_new = *truncated->Find(AName(m.prefix));
    EXPECT_LT(OrthonormalityError(a_new), 1e-6);
    // Each of A's first 3 rows lies in the span of A's rows: a = A'^T (A' a).
    const Matrix basis = Transposed(ToMatrix(a_new));  // in x 3
    const Matrix a = Transposed(ToMatrix(*adapter.Find(AName(m.prefix))));
    for (int64_t l = 0; l < 3; ++l) {
      std::vector<double> projected(static_cast<size_t>(m.in), 0.0);
      for (int64_t c = 0; c < 3; ++c) {
        linalg::Axpy(linalg::Dot(basis.col(c), a.col(l), m.in), basis.col(c), projected.data(), m.in);
      }
      double residual = 0, norm = 0;
      for (int64_t i = 0; i < m.in; ++i) {
        residual = std::max(residual, std::abs(projected[static_cast<size_t>(i)] - a(i, l)));
        norm = std::max(norm, std::abs(a(i, l)));
      }
      EXPECT_LT(residual, 1e-5 * norm) << "row " << l;
    }
  }
}

// in_features 2 < r: only 2 rows of A' can be orthonormal; the third row of A' and column of B' are zero, and the
// product (of rank <= 2) is kept.
TEST(LoraRankTest, TruncationWithFewerInputsThanTheRank) {
  std::mt19937 rng(12);
  const WeightSet adapter = RandomAdapter(rng, {{"narrow", 5, 2}}, 4, DType::kF64);
  StatusOr<WeightSet> truncated = TruncateLoraRank(adapter, 3);
  ASSERT_TRUE(truncated.ok()) << truncated.status().ToString();
  const Matrix a = ToMatrix(*truncated->Find(AName("narrow")));
  const Matrix b = ToMatrix(*truncated->Find(BName("narrow")));
  for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(a(2, i), 0.0);
  for (int64_t o = 0; o < 5; ++o) EXPECT_EQ(b(o, 2), 0.0);
  const Matrix dense = Product(adapter, "narrow");
  EXPECT_LE(MatrixMaxAbsDiff(dense, Product(*truncated, "narrow")), 1e-12 * MaxAbs(dense));
}

struct FactoredMeanCase {
  std::string name;
  std::vector<int64_t> ranks;
  int64_t max_rank;
  DType dtype;
  std::vector<double> weights;
};

std::string WriteSet(const WeightSet& set, const std::filesystem::path& path) {
  EXPECT_TRUE(WriteSafetensorsFile(set, path).ok());
  return path.string();
}

bool HasNumpy() { return std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") == 0; }

// Rounding to the output dtype is all that separates our result from the reference: everything before it is
// double, and the reference's own truncation (np.linalg.svd) agrees with ours to ~1e-13 for these gapped spectra.
// Each factor is rounded once (unit roundoff u: 2^-24 for F32, 2^-8 for BF16, whose significand has 8 bits), so an
// element of B A is off by at most (2u + u^2) sum_l |B_ol||A_li| / (1 - u)^2 in terms of the stored factors: checked
// element by element with 2.1u. As one number per module, max |B A - ref| <= tolerance * max |ref|: since A's rows
// are orthonormal, sum_l |B_ol||A_li| <= ||row o of dW|| <= sqrt(in) max|dW|, a worst case of 2u sqrt(in): 7.5e-7
// for F32 (in <= 40), so 1e-6 (measured: ~7e-8). For BF16 the worst case (0.049) needs every term of a sum to
// round the same way at once; errors of random signs add as a random walk, and 1e-2 = 2.6u is over twice the
// measured ~4.3e-3 (the element-wise bound above is the strict check).
double RoundingBoundRatio(const WeightSet& ours, const std::string& prefix, const Matrix& want, double u) {
  const Matrix b = ToMatrix(*ours.Find(BName(prefix)));
  const Matrix a = ToMatrix(*ours.Find(AName(prefix)));
  const Matrix product = Product(ours, prefix);
  const double slack = 1e-9 * MaxAbs(want);
  double worst = 0;
  for (int64_t o = 0; o < want.rows; ++o) {
    for (int64_t i = 0; i < want.cols; ++i) {
      double terms = 0;
      for (int64_t l = 0; l < b.cols; ++l) terms += std::abs(b(o, l)) * std::abs(a(l, i));
      worst = std::max(worst, std::abs(product(o, i) - want(o, i)) / (2.1 * u * terms + slack));
    }
  }
  return worst;
}

void ExpectMatchesReference(const WeightSet& ours, const WeightSet& reference, const FactoredMeanCase& mc) {
  const double u = mc.dtype == DType::kF32 ? 0x1p-24 : 0x1p-8;
  const double tolerance = mc.dtype == DType::kF32 ? 1e-6 : 1e-2;
  int64_t sum_ranks = 0;
  for (int64_t r : mc.ranks) sum_ranks += r;
  for (const Module& m : SmallModules()) {
    const Matrix want = ToMatrix(*reference.Find(m.prefix + ".delta"));
    const double error = MatrixMaxAbsDiff(Product(ours, m.prefix), want) / MaxAbs(want);
    std::printf("%s %s: max |BA - ref| / max |ref| = %.3g (tolerance %g)\n", mc.name.c_str(), m.prefix.c_str(), error,
                tolerance);
    EXPECT_LE(error, tolerance) << m.prefix;
    EXPECT_LE(RoundingBoundRatio(ours, m.prefix, want, u), 1.0) << m.prefix;
    if (sum_ranks < mc.max_rank) {
      EXPECT_LT(OrthonormalityError(*ours.Find(AName(m.prefix))), 4 * u);
    }
  }
  const Tensor& got_norm = *ours.Find("norm.weight");
  for (int64_t j = 0; j < got_norm.numel(); ++j) {
    const double want = LoadElement(*reference.Find("norm.weight"), j);
    EXPECT_NEAR(LoadElement(got_norm, j), want, std::abs(want) * u) << j;  // one rounding of a double mean
  }
}

// Each case's adapters and global as files, the reference run over them all, then ours compared (see above).
TEST(LoraRankTest, FactoredMeanMatchesNumpyReference) {
  if (!HasNumpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is not installed";
  test_support::TempDir dir("lora_mean");
  std::mt19937 rng(7);
  const std::vector<FactoredMeanCase> cases = {
      {"f32_truncated", {2, 4, 4, 8}, 8, DType::kF32, {100, 250, 37, 1000}},
      {"f32_exact", {2, 3}, 8, DType::kF32, {0.25, 3.5}},
      {"bf16_truncated", {2, 4, 4, 8}, 8, DType::kBF16, {1, 2, 3, 4}},
      {"bf16_exact", {2, 3}, 8, DType::kBF16, {5, 1}},
  };
  nlohmann::json json = nlohmann::json::array();
  std::vector<std::vector<WeightSet>> adapters(cases.size());
  std::vector<WeightSet> globals;
  for (size_t c = 0; c < cases.size(); ++c) {
    const FactoredMeanCase& mc = cases[c];
    globals.push_back(RandomAdapter(rng, SmallModules(), mc.max_rank, mc.dtype));
    std::vector<std::string> paths;
    for (size_t i = 0; i < mc.ranks.size(); ++i) {
      adapters[c].push_back(RandomAdapter(rng, SmallModules(), mc.ranks[i], mc.dtype));
      paths.push_back(WriteSet(adapters[c].back(), dir.path() / (mc.name + "_" + std::to_string(i) + ".safetensors")));
    }
    json.push_back({{"adapters", paths},
                    {"weights", mc.weights},
                    {"global", WriteSet(globals.back(), dir.path() / (mc.name + "_global.safetensors"))},
                    {"out", (dir.path() / (mc.name + "_ref.safetensors")).string()}});
  }
  std::ofstream(dir.path() / "cases.json") << json.dump();
  const std::string command = "/usr/bin/python3 " + test_support::SourcePath("tests/reference/lora_factored_mean.py") +
                              " " + (dir.path() / "cases.json").string() + " > " +
                              (dir.path() / "python.log").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0)
      << command << "\n"
      << (std::stringstream() << std::ifstream(dir.path() / "python.log").rdbuf()).str();

  for (size_t c = 0; c < cases.size(); ++c) {
    const FactoredMeanCase& mc = cases[c];
    SCOPED_TRACE(mc.name);
    std::vector<WeightedAdapter> list;
    for (size_t i = 0; i < mc.ranks.size(); ++i) list.push_back({&adapters[c][i], mc.weights[i]});
    StatusOr<WeightSet> ours = FactoredLoraMean(list, globals[c]);
    ASSERT_TRUE(ours.ok()) << ours.status().ToString();
    ASSERT_TRUE(ours->CheckSameLayout(globals[c]).ok());
    EXPECT_TRUE(ours->metadata().empty());
    StatusOr<WeightSet> reference = ReadSafetensorsFile(json[c]["out"].get<std::string>());
    ASSERT_TRUE(reference.ok()) << reference.status().ToString();
    ExpectMatchesReference(*ours, *reference, mc);
  }
}

// Bit-identical whatever the thread count and run; scaling every weight by 3 changes nothing (integer weights: 3w
// and 3 sum w are exact, so each c_i = w_i / sum w is the same double).
TEST(LoraRankTest, FactoredMeanIsDeterministicAndNormalisesWeights) {
  std::mt19937 rng(8);
  std::vector<WeightSet> sets;
  for (int64_t r : {2, 4, 4, 8}) sets.push_back(RandomAdapter(rng, SmallModules(), r, DType::kF32));
  const WeightSet global = RandomAdapter(rng, SmallModules(), 8, DType::kF32);
  const std::vector<double> weights = {100, 250, 37, 1000};
  std::vector<WeightedAdapter> list, tripled;
  for (size_t i = 0; i < sets.size(); ++i) {
    list.push_back({&sets[i], weights[i]});
    tripled.push_back({&sets[i], 3 * weights[i]});
  }
  StatusOr<WeightSet> one = FactoredLoraMean(list, global, {.num_threads = 1});
  StatusOr<WeightSet> four = FactoredLoraMean(list, global, {.num_threads = 4});
  StatusOr<WeightSet> again = FactoredLoraMean(list, global);
  StatusOr<WeightSet> scaled = FactoredLoraMean(tripled, global, {.num_threads = 3});
  ASSERT_TRUE(one.ok() && four.ok() && again.ok() && scaled.ok()) << one.status().ToString();
  EXPECT_TRUE(SameBytes(*one, *four));
  EXPECT_TRUE(SameBytes(*one, *again));
  EXPECT_TRUE(SameBytes(*one, *scaled));
  // A different weight changes the result (the comparison above can fail).
  tripled[0].weight = 301;
  EXPECT_FALSE(SameBytes(*one, *FactoredLoraMean(tripled, global)));
}

// With sum r_i < r_max the global's factors fill the stack at weight 0: A keeps r_max orthonormal rows and the
// product is the plain mean. Here a single adapter of rank 2 with a global of rank 8 (F64: exact to rounding).
TEST(LoraRankTest, FactoredMeanBelowTheMaximumRankKeepsOrthonormalRows) {
  std::mt19937 rng(9);
  const WeightSet adapter = RandomAdapter(rng, SmallModules(), 2, DType::kF64);
  const WeightSet global = RandomAdapter(rng, SmallModules(), 8, DType::kF64);
  const WeightedAdapter list[] = {{&adapter, 5}};
  StatusOr<WeightSet> mean = FactoredLoraMean(list, global);
  ASSERT_TRUE(mean.ok()) << mean.status().ToString();
  for (const Module& m : SmallModules()) {
    EXPECT_EQ(mean->Find(AName(m.prefix))->shape, (std::vector<int64_t>{8, m.in}));
    EXPECT_LT(OrthonormalityError(*mean->Find(AName(m.prefix))), 1e-12);
    const Matrix want = Product(adapter, m.prefix);
    EXPECT_LE(MatrixMaxAbsDiff(Product(*mean, m.prefix), want), 1e-12 * MaxAbs(want));
  }
  EXPECT_EQ(std::memcmp(mean->Find("norm.weight")->data.data(), adapter.Find("norm.weight")->data.data(), 128), 0);
}

TEST(LoraRankTest, FactoredMeanErrors) {
  std::mt19937 rng(10);
  const WeightSet global = RandomAdapter(rng, SmallModules(), 4, DType::kF32);
  const WeightSet ok = RandomAdapter(rng, SmallModules(), 4, DType::kF32);
  const WeightSet big = RandomAdapter(rng, SmallModules(), 8, DType::kF32);
  ExpectInvalid(FactoredLoraMean({}, global).status(), "no adapters");
  const WeightedAdapter above[] = {{&ok, 1}, {&big, 1}};
  ExpectInvalid(FactoredLoraMean(above, global).status(),
                "adapter #1: update's 'm.0.q_proj.lora_A.weight' has rank 8, above the job's maximum rank 4");
  for (double w : std::vector<double>{0.0, -1.0, NAN, INFINITY}) {
    const WeightedAdapter bad[] = {{&ok, 1}, {&ok, w}};
    ExpectInvalid(FactoredLoraMean(bad, global).status(), "adapter #1 has weight");
  }
  const WeightedAdapter null[] = {{nullptr, 1}};
  ExpectInvalid(FactoredLoraMean(null, global).status(), "adapter #0 is null");
  WeightSet nan = ok.Clone();
  StoreElement((*nan.Find(BName("m.1.v"))), 5, NAN);
  const WeightedAdapter with_nan[] = {{&nan, 1}};
  ExpectInvalid(FactoredLoraMean(with_nan, global).status(), "non-finite");
  const WeightedAdapter fine[] = {{&ok, 1}};
  EXPECT_TRUE(FactoredLoraMean(fine, global).ok());
}

}  // namespace
}  // namespace parsyn::weights
