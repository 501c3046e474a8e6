#include "weights/lora_rank.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "weights/dense_linalg.h"

namespace parsyn::weights {
namespace {

using linalg::Matrix;

constexpr std::string_view kASuffix = ".lora_A.weight";
constexpr std::string_view kBSuffix = ".lora_B.weight";

// One LoRA pair of a set: the indices of its tensors and its dims.
struct LoraPair {
  size_t a = 0;
  size_t b = 0;
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
};

// What each tensor of a set is: not LoRA (pair -1), or pair `pair`'s A or B.
struct Role {
  int64_t pair = -1;
  bool is_a = false;
};

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

Status CheckFactor(const Tensor& t) {
  if (t.shape.size() != 2) {
    return InvalidArgumentError("LoRA tensor " + Quoted(t.name) + " has shape " + ShapeString(t.shape) +
                                ", expected 2 dimensions (lora_A: (r, in_features), lora_B: (out_features, r))");
  }
  if (!IsFloat(t.dtype)) {
    return InvalidArgumentError("LoRA tensor " + Quoted(t.name) + " has dtype " + std::string(DTypeName(t.dtype)) +
                                ", expected F32, BF16, F16 or F64");
  }
  return Status::Ok();
}

// The set's pairs in the order of their lora_A tensors, all checked (see LoraRank).
StatusOr<std::vector<LoraPair>> FindLoraPairs(const WeightSet& set) {
  std::vector<LoraPair> pairs;
  for (size_t i = 0; i < set.size(); ++i) {
    const Tensor& t = set[i];
    const bool is_a = t.name.ends_with(kASuffix);
    if (!is_a && !t.name.ends_with(kBSuffix)) continue;
    const std::string prefix = t.name.substr(0, t.name.size() - (is_a ? kASuffix : kBSuffix).size());
    std::string partner_name = prefix;  // appended, not `+`: GCC 12 warns falsely (-Wrestrict) on the `+`
    partner_name.append(is_a ? kBSuffix : kASuffix);
    const Tensor* partner = set.Find(partner_name);
    if (partner == nullptr) {
      return InvalidArgumentError("LoRA tensor " + Quoted(t.name) + " has no " + Quoted(partner_name) +
                                  " (LoRA factors come in pairs)");
    }
    PARSYN_RETURN_IF_ERROR(CheckFactor(t));
    if (!is_a) continue;  // checked again, with its A, when the loop reaches the A
    PARSYN_RETURN_IF_ERROR(CheckFactor(*partner));
    const int64_t rank = t.shape[0];
    if (partner->shape[1] != rank) {
      return InvalidArgumentError(Quoted(partner->name) + " has rank " + std::to_string(partner->shape[1]) +
                                  " (shape " + ShapeString(partner->shape) + "), its " + Quoted(t.name) + " has rank " +
                                  std::to_string(rank));
    }
    if (rank < 1) return InvalidArgumentError(Quoted(t.name) + " has rank 0 (shape " + ShapeString(t.shape) + ")");
    if (!pairs.empty() && rank != pairs[0].rank) {
      return InvalidArgumentError(Quoted(t.name) + " has rank " + std::to_string(rank) + ", " +
                                  Quoted(set[pairs[0].a].name) + " has rank " + std::to_string(pairs[0].rank) +
                                  " (all pairs of an adapter share one rank)");
    }
    pairs.push_back(LoraPair{.a = i,
                             .b = static_cast<size_t>(partner - set.tensors().data()),
                             .rank = rank,
                             .in = t.shape[1],
                             .out = partner->shape[0]});
  }
  if (pairs.empty()) {
    return InvalidArgumentError("no LoRA pair ('<prefix>.lora_A.weight' with '<prefix>.lora_B.weight') among " +
                                std::to_string(set.size()) + " tensors");
  }
  return pairs;
}

std::vector<Role> RolesOf(size_t num_tensors, const std::vector<LoraPair>& pairs) {
  std::vector<Role> roles(num_tensors);
  for (size_t p = 0; p < pairs.size(); ++p) {
    roles[pairs[p].a] = Role{static_cast<int64_t>(p), true};
    roles[pairs[p].b] = Role{static_cast<int64_t>(p), false};
  }
  return roles;
}

// The adapter's layout at rank r: every LoRA tensor zero at its new shape, the other tensors and the metadata copied.
StatusOr<WeightSet> ZerosAtRank(const WeightSet& adapter, const std::vector<Role>& roles, int64_t r) {
  WeightSet out;
  for (size_t i = 0; i < adapter.size(); ++i) {
    const Tensor& t = adapter[i];
    if (roles[i].pair < 0) {
      PARSYN_RETURN_IF_ERROR(out.Add(t.name, t.dtype, t.shape, t.data));
      continue;
    }
    std::vector<int64_t> shape = t.shape;
    shape[roles[i].is_a ? 0 : 1] = r;
    PARSYN_RETURN_IF_ERROR(out.AddZeros(t.name, t.dtype, std::move(shape)).status());
  }
  out.metadata() = adapter.metadata();
  return out;
}

// The adapter with each pair's first min(rank, r) ranks copied byte for byte and the rest zero, at rank r; or, with a
// `donor` (the adapter's layout at a rank >= r, the same dtypes), the rest copied from the donor's same ranks.
StatusOr<WeightSet> CopyAtRank(const WeightSet& adapter, const std::vector<LoraPair>& pairs, int64_t r,
                               const WeightSet* donor = nullptr) {
  const std::vector<Role> roles = RolesOf(adapter.size(), pairs);
  PARSYN_ASSIGN_OR_RETURN(WeightSet out, ZerosAtRank(adapter, roles, r));
  for (size_t i = 0; i < adapter.size(); ++i) {
    if (roles[i].pair < 0) continue;
    const Tensor& t = adapter[i];
    const LoraPair& p = pairs[static_cast<size_t>(roles[i].pair)];
    const size_t element = DTypeSize(t.dtype);
    const auto keep = static_cast<size_t>(std::min(p.rank, r));
    const Tensor* from = donor != nullptr ? donor->Find(t.name) : nullptr;
    const int64_t donor_rank = from == nullptr ? 0 : from->shape[roles[i].is_a ? 0 : 1];
    const std::span<std::byte> bytes = out[i].data;
    if (roles[i].is_a) {  // (rank, in) -> (r, in): the first rows are contiguous
      const size_t row = static_cast<size_t>(p.in) * element;
      std::memcpy(bytes.data(), t.data.data(), keep * row);
      if (from != nullptr) std::memcpy(bytes.data() + keep * row, from->data.data() + keep * row, (r - keep) * row);
    } else {  // (out, rank) -> (out, r): the first columns of each row
      for (int64_t o = 0; o < p.out; ++o) {
        std::byte* row = bytes.data() + static_cast<size_t>(o * r) * element;
        std::memcpy(row, t.data.data() + static_cast<size_t>(o * p.rank) * element, keep * element);
        if (from != nullptr) {
          std::memcpy(row + keep * element,
                      from->data.data() + static_cast<size_t>(o * donor_rank) * element + keep * element,
                      (r - keep) * element);
        }
      }
    }
  }
  return out;
}

// Adds `scale` times B (out, rank) into columns [offset, offset + rank) of b_stack.
void LoadB(const Tensor& b, double scale, Matrix& b_stack, int64_t offset) {
  const int64_t rank = b.shape[1];
  for (int64_t o = 0; o < b.shape[0]; ++o) {
    for (int64_t l = 0; l < rank; ++l) b_stack(o, offset + l) = scale * LoadElement(b, o * rank + l);
  }
}

// A (rank, in) transposed into columns [offset, offset + rank) of at_stack: row l of A is column offset + l.
void LoadAt(const Tensor& a, Matrix& at_stack, int64_t offset) {
  const int64_t in = a.shape[1];
  for (int64_t l = 0; l < a.shape[0]; ++l) {
    double* column = at_stack.col(offset + l);
    for (int64_t i = 0; i < in; ++i) column[i] = LoadElement(a, l * in + i);
  }
}

// The best rank-r factors of b_stack at_stack^T (out x R times R x in), written into a_out (r, in) and b_out
// (out, r), which must be zero-filled: B' = Q_B U_r S_r and A' = V_r^T Q_A^T (lora_rank.h).
void WriteTruncatedFactors(Matrix b_stack, Matrix at_stack, int64_t r, const Tensor& a_out, const Tensor& b_out) {
  const int64_t out = b_stack.rows;
  const int64_t in = at_stack.rows;
  const linalg::HouseholderQr qb(std::move(b_stack));
  const linalg::HouseholderQr qa(std::move(at_stack));
  // M = R_B R_A^T (k_B x k_A) = U S V^T; JacobiSvd gives W = U S and V, sorted by singular value.
  const linalg::JacobiSvdResult svd = linalg::JacobiSvd(linalg::MultiplyTransposed(qb.R(), qa.R()));
  const int64_t keep = std::min(r, qa.k());  // below r only where in_features < r
  Matrix w_kept(qb.k(), keep);
  Matrix v_kept(qa.k(), keep);
  for (int64_t c = 0; c < keep; ++c) {
    std::copy(svd.w.col(c), svd.w.col(c) + qb.k(), w_kept.col(c));
    std::copy(svd.v.col(c), svd.v.col(c) + qa.k(), v_kept.col(c));
  }
  const Matrix b_new = qb.ApplyQ(w_kept);   // out x keep: B'
  const Matrix at_new = qa.ApplyQ(v_kept);  // in x keep: A'^T
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < keep; ++c) StoreElement(b_out, o * r + c, b_new(o, c));
  }
  for (int64_t c = 0; c < keep; ++c) {
    const double* row = at_new.col(c);
    for (int64_t i = 0; i < in; ++i) StoreElement(a_out, c * in + i, row[i]);
  }
}

// Calls fn(0) ... fn(n - 1), each once, spread over threads. Each call's work is its own, so the results do not
// depend on the split.
void ForEachModule(size_t n, int num_threads, const std::function<void(size_t)>& fn) {
  size_t threads = num_threads > 0 ? static_cast<size_t>(num_threads)
                                   : std::min<size_t>(8, std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::jthread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(worker);
  worker();
}

}  // namespace

StatusOr<int64_t> LoraRank(const WeightSet& adapter) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  return pairs[0].rank;
}

StatusOr<int64_t> CheckLoraLayoutUpToRank(const WeightSet& global, const WeightSet& update) {
  StatusOr<std::vector<LoraPair>> pairs = FindLoraPairs(global);
  if (!pairs.ok()) return pairs.status().WithContext("global");
  const int64_t max_rank = (*pairs)[0].rank;
  // The update's rank: that of its tensor named as the global's first lora_A; the layout check below reports any
  // other problem with that tensor.
  const std::string& first_name = global[(*pairs)[0].a].name;
  const Tensor* first = update.Find(first_name);
  const int64_t r = first != nullptr && first->shape.size() == 2 ? first->shape[0] : max_rank;
  for (const LoraPair& p : *pairs) {
    for (const auto& [index, rank_dim] : {std::pair{p.a, 0}, std::pair{p.b, 1}}) {
      const Tensor* u = update.Find(global[index].name);
      if (u == nullptr || u->shape.size() != 2 || u->shape[rank_dim] == r) continue;
      return InvalidArgumentError("update's " + Quoted(u->name) + " has rank " + std::to_string(u->shape[rank_dim]) +
                                  ", its " + Quoted(first_name) + " has rank " + std::to_string(r) +
                                  " (one rank for the whole update)");
    }
  }
  if (r < 1) return InvalidArgumentError("update's " + Quoted(first_name) + " has rank 0");
  if (r > max_rank) {
    return InvalidArgumentError("update's " + Quoted(first_name) + " has rank " + std::to_string(r) +
                                ", above the job's maximum rank " + std::to_string(max_rank));
  }
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Entry> want;
  want.reserve(global.size());
  for (const Tensor& t : global.tensors()) want.push_back(Entry{t.name, t.dtype, t.shape});
  for (const LoraPair& p : *pairs) {
    want[p.a].shape = {r, p.in};
    want[p.b].shape = {p.out, r};
  }
  Status layout = CheckLayoutMatches(want, update.tensors());
  if (!layout.ok()) return layout.WithContext("update");
  return r;
}

StatusOr<WeightSet> ZeroPadLoraRank(const WeightSet& adapter, int64_t r) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  if (r < pairs[0].rank) {
    return InvalidArgumentError("cannot zero-pad " + Quoted(adapter[pairs[0].a].name) + " of rank " +
                                std::to_string(pairs[0].rank) + " to the lower rank " + std::to_string(r));
  }
  return CopyAtRank(adapter, pairs, r);
}

StatusOr<WeightSet> ExtendLoraRank(const WeightSet& adapter, const WeightSet& donor) {
  PARSYN_ASSIGN_OR_RETURN(const int64_t r, CheckLoraLayoutUpToRank(donor, adapter));
  (void)r;  // the adapter's rank, <= the donor's
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  PARSYN_ASSIGN_OR_RETURN(const int64_t donor_rank, LoraRank(donor));
  return CopyAtRank(adapter, pairs, donor_rank, &donor);
}

StatusOr<WeightSet> ScaleLoraProducts(const WeightSet& adapter, double factor) {
  if (!std::isfinite(factor) || factor <= 0) {
    return InvalidArgumentError("a LoRA product's scale must be finite and > 0, got " + std::to_string(factor));
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  WeightSet out = adapter.Clone();
  for (const LoraPair& p : pairs) {
    const Tensor& b = out[p.b];
    for (int64_t i = 0; i < b.numel(); ++i) StoreElement(b, i, factor * LoadElement(b, i));
  }
  return out;
}

StatusOr<WeightSet> SliceLoraRank(const WeightSet& adapter, int64_t r) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  if (r < 1 || r > pairs[0].rank) {
    return InvalidArgumentError("cannot slice " + Quoted(adapter[pairs[0].a].name) + " of rank " +
                                std::to_string(pairs[0].rank) + " to rank " + std::to_string(r) +
                                " (1 <= r <= the rank)");
  }
  return CopyAtRank(adapter, pairs, r);
}

StatusOr<WeightSet> TruncateLoraRank(const WeightSet& adapter, int64_t r, const LoraMathOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(adapter));
  if (r < 1 || r > pairs[0].rank) {
    return InvalidArgumentError("cannot truncate " + Quoted(adapter[pairs[0].a].name) + " of rank " +
                                std::to_string(pairs[0].rank) + " to rank " + std::to_string(r) +
                                " (1 <= r <= the rank)");
  }
  PARSYN_ASSIGN_OR_RETURN(WeightSet out, ZerosAtRank(adapter, RolesOf(adapter.size(), pairs), r));
  ForEachModule(pairs.size(), options.num_threads, [&](size_t m) {
    const LoraPair& p = pairs[m];
    Matrix b_stack(p.out, p.rank);
    Matrix at_stack(p.in, p.rank);
    LoadB(adapter[p.b], 1.0, b_stack, 0);
    LoadAt(adapter[p.a], at_stack, 0);
    WriteTruncatedFactors(std::move(b_stack), std::move(at_stack), r, out[p.a], out[p.b]);
  });
  return out;
}

namespace {

// The checks of FactoredLoraMean (lora_rank.h); returns each adapter's rank.
StatusOr<std::vector<int64_t>> CheckMeanInputs(std::span<const WeightedAdapter> adapters, const WeightSet& global) {
  if (adapters.empty()) return InvalidArgumentError("no adapters to average");
  std::vector<int64_t> ranks;
  double total = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const std::string which = "adapter #" + std::to_string(i);
    const WeightedAdapter& a = adapters[i];
    if (a.adapter == nullptr) return InvalidArgumentError(which + " is null");
    if (!std::isfinite(a.weight) || a.weight <= 0) {
      return InvalidArgumentError(which + " has weight " + std::to_string(a.weight) +
                                  "; weights must be finite and > 0");
    }
    StatusOr<int64_t> rank = CheckLoraLayoutUpToRank(global, *a.adapter);
    if (!rank.ok()) return rank.status().WithContext(which);
    Status finite = CheckFinite(*a.adapter);
    if (!finite.ok()) return finite.WithContext(which);
    ranks.push_back(*rank);
    total += a.weight;
  }
  if (!std::isfinite(total)) return InvalidArgumentError("the adapters' weights sum to infinity");
  Status finite = CheckFinite(global);  // its factors join the stack when the ranks sum below its rank
  if (!finite.ok()) return finite.WithContext("global");
  for (const Tensor& t : global.tensors()) {
    if (!IsFloat(t.dtype)) {
      return InvalidArgumentError("tensor " + Quoted(t.name) + " has dtype " + std::string(DTypeName(t.dtype)) +
                                  "; only float tensors can be averaged");
    }
  }
  return ranks;
}

}  // namespace

StatusOr<WeightSet> FactoredLoraMean(std::span<const WeightedAdapter> adapters, const WeightSet& global,
                                     const LoraMathOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, CheckMeanInputs(adapters, global));
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraPair> pairs, FindLoraPairs(global));  // checked by CheckMeanInputs
  const int64_t max_rank = pairs[0].rank;
  double total = 0;
  for (const WeightedAdapter& a : adapters) total += a.weight;
  std::vector<double> coefficients;
  for (const WeightedAdapter& a : adapters) coefficients.push_back(a.weight / total);
  int64_t stacked = 0;
  for (int64_t rank : ranks) stacked += rank;
  const bool add_global = stacked < max_rank;
  if (add_global) stacked += max_rank;

  WeightSet out;
  for (const Tensor& t : global.tensors()) PARSYN_RETURN_IF_ERROR(out.AddZeros(t.name, t.dtype, t.shape).status());
  // Work items: the pairs, then the other tensors (their indices in the set).
  const std::vector<Role> roles = RolesOf(global.size(), pairs);
  std::vector<size_t> plain;
  for (size_t i = 0; i < global.size(); ++i) {
    if (roles[i].pair < 0) plain.push_back(i);
  }
  ForEachModule(pairs.size() + plain.size(), options.num_threads, [&](size_t item) {
    if (item >= pairs.size()) {  // sum_i c_i x_i, in the adapters' order
      const size_t t = plain[item - pairs.size()];
      for (int64_t j = 0; j < global[t].numel(); ++j) {
        double sum = 0;
        for (size_t i = 0; i < adapters.size(); ++i) sum += coefficients[i] * LoadElement((*adapters[i].adapter)[t], j);
        StoreElement(out[t], j, sum);
      }
      return;
    }
    const LoraPair& p = pairs[item];
    Matrix b_stack(p.out, stacked);
    Matrix at_stack(p.in, stacked);
    int64_t offset = 0;
    for (size_t i = 0; i < adapters.size(); ++i) {
      LoadB((*adapters[i].adapter)[p.b], coefficients[i], b_stack, offset);
      LoadAt((*adapters[i].adapter)[p.a], at_stack, offset);
      offset += ranks[i];
    }
    if (add_global) LoadAt(global[p.a], at_stack, offset);  // with weight 0: its B columns stay zero
    WriteTruncatedFactors(std::move(b_stack), std::move(at_stack), max_rank, out[p.a], out[p.b]);
  });
  return out;
}

}  // namespace parsyn::weights
