// WeightSet: an ordered set of named tensors (name -> dtype, shape, bytes), owning its bytes or memory-mapped.
//
// This is how every layer passes model weights around: the trainer's adapters, a round's global, a worker's update.
// A WeightSet is not thread-safe to mutate; const access from several threads at once is safe.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace parsyn::weights {

enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL".
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; InvalidArgument naming the unknown dtype.
StatusOr<DType> ParseDType(std::string_view name);
// F32, F16, BF16, F64.
bool IsFloat(DType dtype);

// Product of dims; InvalidArgument on a negative dim or on overflow of int64.
StatusOr<int64_t> NumElements(std::span<const int64_t> shape);
// "[8, 4096]"
std::string ShapeString(std::span<const int64_t> shape);

// One tensor of a WeightSet. `data` points into storage the WeightSet keeps alive and is always aligned to the
// dtype's element size (owned buffers to 64 bytes), so as<T>() is a valid typed view.
struct Tensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<std::byte> data;

  int64_t numel() const { return static_cast<int64_t>(data.size() / DTypeSize(dtype)); }
  // Typed view; the caller must know the dtype (asserts it matches the element size).
  template <typename T>
  std::span<T> as() const {
    assert(sizeof(T) == DTypeSize(dtype));
    return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
  }
};

class WeightSet {
 public:
  WeightSet() = default;
  WeightSet(WeightSet&&) noexcept = default;
  WeightSet& operator=(WeightSet&&) noexcept = default;
  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  // Adds a tensor whose bytes are copied from `bytes`. InvalidArgument if the name is empty or taken, the shape is
  // invalid, or bytes.size() != numel * DTypeSize(dtype).
  Status Add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> bytes);
  // Adds a zero-filled tensor and returns its bytes to fill in. Same errors as Add.
  StatusOr<std::span<std::byte>> AddZeros(std::string name, DType dtype, std::vector<int64_t> shape);
  // Adds a tensor whose bytes live in `backing` (e.g. a memory-mapped file), kept alive by this set. Same errors as
  // Add, and InvalidArgument if `bytes` is not aligned to the dtype's element size.
  Status AddView(std::string name, DType dtype, std::vector<int64_t> shape, std::span<std::byte> bytes,
                 std::shared_ptr<const void> backing);

  size_t size() const { return tensors_.size(); }
  bool empty() const { return tensors_.empty(); }
  // Tensors in insertion order.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor& operator[](size_t i) const { return tensors_[i]; }
  // nullptr when absent.
  const Tensor* Find(std::string_view name) const;
  // Sum of all tensors' byte sizes.
  uint64_t total_bytes() const;

  // The safetensors `__metadata__` map (string -> string).
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A deep copy that owns its bytes.
  WeightSet Clone() const;

  // Read-only file mappings (MapSafetensorsFileReadOnly): pages of them that this process has touched count in its
  // RSS, but they are page cache, which can be handed back at any time and is read again on the next access.
  // Records that `mapping` is such a mapping (kept alive through a backing of this set's tensors).
  void AddReadOnlyMapping(std::span<const std::byte> mapping);
  // Bytes of tensors that do not lie in a read-only mapping: what this set pins in memory.
  uint64_t pinned_bytes() const;
  // Drops this process's pages covering `bytes` (rounded out to whole pages) where they lie in a read-only mapping
  // (madvise MADV_DONTNEED); a no-op for other memory. Values stay readable: they fault in again from the file.
  void ReleasePages(std::span<const std::byte> bytes) const;
  // ReleasePages over every read-only mapping of the set.
  void ReleasePages() const;
  // Maps every read-only mapping's pages now, one call per mapping (madvise MADV_POPULATE_READ), for a reader about
  // to read all of them: it then takes no page faults (one per 64 KiB otherwise). Best effort: the pages come from
  // the page cache (read from the file where they are not cached); on failure the reader faults them in as before.
  void PopulatePages() const;

  // OK iff `other` has the same names in the same order with equal dtypes and shapes. Otherwise InvalidArgument
  // whose message names the first difference, e.g. "tensor 'x.lora_A.weight' has shape [8, 16], expected [16, 16]".
  Status CheckSameLayout(const WeightSet& other) const;

 private:
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::shared_ptr<const void>> backing_;  // keeps owned buffers and mappings alive
  std::map<std::string, std::string> metadata_;
  std::vector<std::span<const std::byte>> read_only_mappings_;
};

// CheckSameLayout's rules and messages with `want` and `got` as any layouts: vectors of entries with name, dtype and
// shape (WeightSet's tensors, the weighted mean's layout kept without bytes, a safetensors header's entries).
template <typename Want, typename Got>
Status CheckLayoutMatches(const std::vector<Want>& want, const std::vector<Got>& got) {
  auto holds = [](const auto& entries, const std::string& name) {
    for (const auto& e : entries) {
      if (e.name == name) return true;
    }
    return false;
  };
  const size_t common = std::min(want.size(), got.size());
  for (size_t i = 0; i < common; ++i) {
    const Want& w = want[i];
    const Got& g = got[i];
    if (w.name != g.name) {
      if (!holds(want, g.name)) return InvalidArgumentError("unexpected tensor '" + g.name + "'");
      if (!holds(got, w.name)) return InvalidArgumentError("missing tensor '" + w.name + "'");
      return InvalidArgumentError("tensor #" + std::to_string(i) + " is '" + g.name + "', expected '" + w.name +
                                  "' (tensors are in a different order)");
    }
    if (w.dtype != g.dtype) {
      return InvalidArgumentError("tensor '" + g.name + "' has dtype " + std::string(DTypeName(g.dtype)) +
                                  ", expected " + std::string(DTypeName(w.dtype)));
    }
    if (w.shape != g.shape) {
      return InvalidArgumentError("tensor '" + g.name + "' has shape " + ShapeString(g.shape) + ", expected " +
                                  ShapeString(w.shape));
    }
  }
  if (got.size() != want.size()) {
    const bool fewer = got.size() < want.size();
    return InvalidArgumentError(std::string(fewer ? "missing" : "unexpected") + " tensor '" +
                                (fewer ? want[common].name : got[common].name) + "' (" + std::to_string(got.size()) +
                                " tensors, expected " + std::to_string(want.size()) + ")");
  }
  return Status::Ok();
}
template <typename Want>
Status CheckLayoutMatches(const std::vector<Want>& want, const WeightSet& got) {
  return CheckLayoutMatches(want, got.tensors());
}

// OK when every float tensor (F32, F16, BF16, F64) holds only finite values. Otherwise InvalidArgument naming the
// tensor and the flat index of the first NaN/Inf: "tensor 'w' has a non-finite value (nan) at index 17".
// Tensors in a read-only mapping have their pages handed back once checked, so at most one is resident at a time.
Status CheckFinite(const WeightSet& set);

// Converting helpers used by kernels and tests.
float Bf16ToFloat(uint16_t v);
uint16_t FloatToBf16(float f);  // round to nearest even; NaN stays NaN
float F16ToFloat(uint16_t v);
uint16_t FloatToF16(float f);  // round to nearest even

// Element i (flat, row-major) of a float tensor (F32, F64, BF16, F16), widened to double; 0 for any other dtype.
// Inline, as StoreElement: kernels call them per element.
inline double LoadElement(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kF64: return t.as<double>()[i];
    case DType::kBF16: return Bf16ToFloat(t.as<uint16_t>()[i]);
    case DType::kF16: return F16ToFloat(t.as<uint16_t>()[i]);
    default: return 0;
  }
}

// Stores `value` as element i of a float tensor, rounded to its dtype (nearest even through fp32 for BF16 and F16);
// nothing for any other dtype.
inline void StoreElement(const Tensor& t, int64_t i, double value) {
  switch (t.dtype) {
    case DType::kF32: t.as<float>()[i] = static_cast<float>(value); break;
    case DType::kF64: t.as<double>()[i] = value; break;
    case DType::kBF16: t.as<uint16_t>()[i] = FloatToBf16(static_cast<float>(value)); break;
    case DType::kF16: t.as<uint16_t>()[i] = FloatToF16(static_cast<float>(value)); break;
    default: break;
  }
}

}  // namespace parsyn::weights
