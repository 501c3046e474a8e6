#include "strategy/robust_aggregation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "strategy/fed_avg.h"

namespace parsyn::strategy {
namespace {

using weights::DType;
using weights::Tensor;
using weights::WeightSet;

bool IsAggregatedDtype(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16; }

// values[0, count) = tensor elements [begin, begin + count) widened to float (exact for all three dtypes).
void LoadChunk(const Tensor& tensor, size_t begin, size_t count, float* values) {
  switch (tensor.dtype) {
    case DType::kF32: {
      std::memcpy(values, tensor.as<float>().data() + begin, count * sizeof(float));
      return;
    }
    case DType::kBF16: {
      const uint16_t* in = tensor.as<uint16_t>().data() + begin;
      for (size_t i = 0; i < count; ++i) values[i] = weights::Bf16ToFloat(in[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* in = tensor.as<uint16_t>().data() + begin;
      for (size_t i = 0; i < count; ++i) values[i] = weights::F16ToFloat(in[i]);
      return;
    }
    default: return;  // Begin admits only the three above
  }
}

// Element `index` of `out` (a tensor of `dtype`) = value, rounded to nearest even for BF16/F16.
void StoreValue(DType dtype, std::span<std::byte> out, size_t index, float value) {
  switch (dtype) {
    case DType::kF32: reinterpret_cast<float*>(out.data())[index] = value; return;
    case DType::kBF16: reinterpret_cast<uint16_t*>(out.data())[index] = weights::FloatToBf16(value); return;
    case DType::kF16: reinterpret_cast<uint16_t*>(out.data())[index] = weights::FloatToF16(value); return;
    default: return;
  }
}

// Ascending, with -0 before +0, so that equal-comparing values still sort the same whatever their input order.
bool ValueLess(float a, float b) { return a < b || (a == b && std::signbit(a) && !std::signbit(b)); }

// Stages chunk [begin, begin + count) of tensor t of `update` as floats, then hands its pages back: the coordinator's
// updates are read-only mappings (page cache), read once here, so they never all become resident at once.
void LoadAndRelease(const WeightSet& update, size_t t, size_t begin, size_t count, float* out) {
  const weights::Tensor& tensor = update[t];
  LoadChunk(tensor, begin, count, out);
  const size_t element = weights::DTypeSize(tensor.dtype);
  update.ReleasePages(std::span<const std::byte>(tensor.data).subspan(begin * element, count * element));
}

// Runs fn(column, out_index) for every coordinate of every tensor, where column holds that coordinate's value in
// each update (update i at column[i], widened to float), and stores fn's float result in the output tensor. The
// updates are staged chunk by chunk: K x kChunkElements floats at a time.
template <typename ColumnFn>
StatusOr<WeightSet> MapCoordinates(const std::vector<const WeightSet*>& updates, const std::vector<LayoutEntry>& layout,
                                   ColumnFn&& fn) {
  const size_t k = updates.size();
  const size_t chunk = RobustAggregation::kChunkElements;
  std::vector<float> staged(k * chunk);
  std::vector<float> column(k);
  WeightSet result;
  for (size_t t = 0; t < layout.size(); ++t) {
    const LayoutEntry& entry = layout[t];
    StatusOr<std::span<std::byte>> out = result.AddZeros(entry.name, entry.dtype, entry.shape);
    if (!out.ok()) return out.status();
    const size_t numel = out->size() / weights::DTypeSize(entry.dtype);
    for (size_t begin = 0; begin < numel; begin += chunk) {
      const size_t count = std::min(chunk, numel - begin);
      for (size_t u = 0; u < k; ++u) LoadAndRelease(*updates[u], t, begin, count, staged.data() + u * chunk);
      for (size_t j = 0; j < count; ++j) {
        for (size_t u = 0; u < k; ++u) column[u] = staged[u * chunk + j];
        StoreValue(entry.dtype, *out, begin + j, fn(column));
      }
    }
  }
  return result;
}

std::vector<const WeightSet*> Pointers(const std::vector<KeptUpdate>& updates) {
  std::vector<const WeightSet*> pointers;
  pointers.reserve(updates.size());
  for (const auto& u : updates) pointers.push_back(&u.weights);
  return pointers;
}

// Canonical order of updates: by their bytes (memcmp order, tensor by tensor), then by sample count. Updates equal
// in both are interchangeable, so any order among them gives the same result.
bool CanonicalLess(const KeptUpdate& a, const KeptUpdate& b) {
  for (size_t t = 0; t < a.weights.size(); ++t) {
    const auto& da = a.weights[t].data;
    const auto& db = b.weights[t].data;
    const int c = std::memcmp(da.data(), db.data(), std::min(da.size(), db.size()));
    if (c != 0) return c < 0;
  }
  return a.sample_count < b.sample_count;
}

}  // namespace

// --- RobustAggregation ---

std::vector<ParticipantConfig> RobustAggregation::ConfigureRound(const RoundContext& ctx,
                                                                 std::span<const Candidate> available) const {
  return FedAvg().ConfigureRound(ctx, available);
}

StatusOr<RoundPlan> RobustAggregation::BeginRound(int /*round*/, const WeightSet& global) {
  if (Status options = ValidateOptions(); !options.ok()) return options;
  for (const Tensor& t : global.tensors()) {
    if (!IsAggregatedDtype(t.dtype)) {
      return InvalidArgumentError("global tensor '" + t.name + "' has dtype " +
                                  std::string(weights::DTypeName(t.dtype)) + "; " + std::string(name()) +
                                  " aggregates F32, BF16 and F16 tensors only");
    }
  }
  return RoundPlan{.combination = Combination::kKeepAll};
}

StatusOr<WeightSet> RobustAggregation::FinishFromKept(std::vector<KeptUpdate>& updates,
                                                      const std::vector<LayoutEntry>& layout) {
  PARSYN_RETURN_IF_ERROR(CheckUpdateCount(static_cast<int>(updates.size())));
  std::stable_sort(updates.begin(), updates.end(), CanonicalLess);
  return Aggregate(updates, layout);
}

// --- Median ---

StatusOr<WeightSet> Median::Aggregate(const std::vector<KeptUpdate>& updates, const std::vector<LayoutEntry>& layout) {
  const size_t n = updates.size();
  const size_t mid = n / 2;
  return MapCoordinates(Pointers(updates), layout, [n, mid](std::vector<float>& column) {
    std::nth_element(column.begin(), column.begin() + mid, column.end(), ValueLess);
    const float upper = column[mid];
    if (n % 2 == 1) return upper;
    const float lower = *std::max_element(column.begin(), column.begin() + mid, ValueLess);
    return static_cast<float>((static_cast<double>(lower) + static_cast<double>(upper)) * 0.5);
  });
}

// --- TrimmedMean ---

TrimmedMean::TrimmedMean(TrimmedMeanOptions options) : options_(options) {}

Status TrimmedMean::Validate(const TrimmedMeanOptions& options) {
  if (!(options.beta >= 0.0 && options.beta < 0.5)) {
    return InvalidArgumentError("beta must be at least 0 and below 0.5 (the fraction trimmed from each end), got " +
                                std::to_string(options.beta));
  }
  return Status::Ok();
}

StatusOr<WeightSet> TrimmedMean::Aggregate(const std::vector<KeptUpdate>& updates,
                                           const std::vector<LayoutEntry>& layout) {
  const size_t n = updates.size();
  const auto trimmed = static_cast<size_t>(std::floor(options_.beta * static_cast<double>(n)));
  const size_t kept = n - 2 * trimmed;  // >= 1 since beta < 0.5
  return MapCoordinates(Pointers(updates), layout, [trimmed, kept](std::vector<float>& column) {
    std::sort(column.begin(), column.end(), ValueLess);
    double sum = 0.0;
    for (size_t i = trimmed; i < trimmed + kept; ++i) sum += static_cast<double>(column[i]);
    return static_cast<float>(sum / static_cast<double>(kept));
  });
}

// --- Krum / MultiKrum ---

Krum::Krum(KrumOptions options) : KrumBase(options.f, 1) {}

Status Krum::Validate(const KrumOptions& options) {
  if (options.f < 0) {
    return InvalidArgumentError("f (the assumed number of Byzantine updates) must be at least 0, got " +
                                std::to_string(options.f));
  }
  return Status::Ok();
}

MultiKrum::MultiKrum(MultiKrumOptions options) : KrumBase(options.f, options.m) {}

Status MultiKrum::Validate(const MultiKrumOptions& options) {
  if (Status f = Krum::Validate(KrumOptions{.f = options.f}); !f.ok()) return f;
  if (options.m < 0) {
    return InvalidArgumentError("m (the number of updates averaged) must be at least 1, or 0 for n - f; got " +
                                std::to_string(options.m));
  }
  return Status::Ok();
}

Status KrumBase::CheckUpdateCount(int count) const {
  if (count < 2 * f_ + 3) {
    return FailedPreconditionError(std::string(name()) + " with f = " + std::to_string(f_) +
                                   " needs at least 2f + 3 = " + std::to_string(2 * f_ + 3) + " updates, got " +
                                   std::to_string(count) + "; lower f or raise min_workers");
  }
  if (m_ > count) {
    return FailedPreconditionError(std::string(name()) + " with m = " + std::to_string(m_) + " needs at least " +
                                   std::to_string(m_) + " updates, got " + std::to_string(count) +
                                   "; lower m or raise min_workers");
  }
  return Status::Ok();
}

StatusOr<WeightSet> KrumBase::Aggregate(const std::vector<KeptUpdate>& updates,
                                        const std::vector<LayoutEntry>& layout) {
  const size_t n = updates.size();
  const size_t chunk = kChunkElements;

  // Squared distances, accumulated chunk by chunk in double.
  std::vector<double> distance(n * n, 0.0);
  std::vector<float> staged(n * chunk);
  for (size_t t = 0; t < layout.size(); ++t) {
    const size_t numel = static_cast<size_t>(updates[0].weights[t].numel());
    for (size_t begin = 0; begin < numel; begin += chunk) {
      const size_t count = std::min(chunk, numel - begin);
      for (size_t u = 0; u < n; ++u) LoadAndRelease(updates[u].weights, t, begin, count, staged.data() + u * chunk);
      for (size_t i = 0; i < n; ++i) {
        const float* a = staged.data() + i * chunk;
        for (size_t j = i + 1; j < n; ++j) {
          const float* b = staged.data() + j * chunk;
          double sum = 0.0;
          for (size_t e = 0; e < count; ++e) {
            const double d = static_cast<double>(a[e]) - static_cast<double>(b[e]);
            sum += d * d;
          }
          distance[i * n + j] += sum;
        }
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < i; ++j) distance[i * n + j] = distance[j * n + i];
  }

  // Score: sum of the n - f - 2 smallest distances to the others, added smallest first.
  const size_t nearest = n - static_cast<size_t>(f_) - 2;  // >= 1 since n >= 2f + 3
  std::vector<double> scores(n);
  std::vector<double> others;
  for (size_t i = 0; i < n; ++i) {
    others.clear();
    for (size_t j = 0; j < n; ++j) {
      if (j != i) others.push_back(distance[i * n + j]);
    }
    std::sort(others.begin(), others.end());
    scores[i] = std::accumulate(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(nearest), 0.0);
  }
  std::vector<size_t> ranking(n);
  std::iota(ranking.begin(), ranking.end(), size_t{0});
  std::stable_sort(ranking.begin(), ranking.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });

  const size_t m = m_ > 0 ? static_cast<size_t>(m_) : n - static_cast<size_t>(f_);
  if (m == 1) {  // Krum: the winner itself, bit for bit
    const WeightSet& best = updates[ranking[0]].weights;
    WeightSet result;
    for (const Tensor& t : best.tensors()) {
      if (Status added = result.Add(t.name, t.dtype, t.shape, t.data); !added.ok()) return added;
    }
    return result;
  }

  std::vector<size_t> chosen(ranking.begin(), ranking.begin() + static_cast<std::ptrdiff_t>(m));
  std::sort(chosen.begin(), chosen.end());  // summed in canonical order
  std::vector<const WeightSet*> selected;
  for (size_t i : chosen) selected.push_back(&updates[i].weights);
  const double count = static_cast<double>(m);
  return MapCoordinates(selected, layout, [count](std::vector<float>& column) {
    double sum = 0.0;
    for (float v : column) sum += static_cast<double>(v);
    return static_cast<float>(sum / count);
  });
}

}  // namespace parsyn::strategy
