#include "weights/weight_set.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "weights/buffer.h"

namespace parsyn::weights {

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and the pages are touched instead
#endif

size_t PageSize() {
  static const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// `size_bytes` rounded up to whole pages: the length of a mapping of that many bytes.
size_t MappedSize(size_t size_bytes) { return (size_bytes + PageSize() - 1) / PageSize() * PageSize(); }

// A zero-filled anonymous mapping of MappedSize(size_bytes), starting on a 2 MiB boundary and marked for transparent
// huge pages (MADV_HUGEPAGE: where the kernel's THP setting is "madvise" or "always" it backs the mapping with 2 MiB
// pages, one fault and one clear per 2 MiB; where it is "never" the advice changes nothing), its pages populated in one
// call where memory allows. nullptr when the address space is exhausted.
std::byte* MapZeroedHugePages(size_t size_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t reserved = size_bytes + kHugePage;
  void* mapped = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  // Trim the reservation to the aligned range: the unaligned head and the tail past it go back at once.
  const auto begin = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const size_t mapped_size = MappedSize(size_bytes);
  if (aligned > begin) ::munmap(mapped, aligned - begin);
  if (begin + reserved > aligned + mapped_size) {
    ::munmap(reinterpret_cast<void*>(aligned + mapped_size), begin + reserved - (aligned + mapped_size));
  }
  auto* bytes = reinterpret_cast<std::byte*>(aligned);
  ::madvise(bytes, mapped_size, MADV_HUGEPAGE);
  // Best effort, as MAP_POPULATE is: where populating fails for want of memory, the pages fault in when written.
  if (::madvise(bytes, mapped_size, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
    // No MADV_POPULATE_WRITE (before Linux 5.14): one write per page faults each in.
    for (size_t at = 0; at < mapped_size; at += PageSize()) {
      reinterpret_cast<volatile std::byte*>(bytes)[at] = std::byte{0};
    }
  }
  return bytes;
}

}  // namespace

std::shared_ptr<std::byte> internal::AllocateZeroedBuffer(size_t size_bytes) {
  constexpr size_t kMapThreshold = size_t{1} << 20;
  if (size_bytes >= kMapThreshold) {
    std::byte* mapped = MapZeroedHugePages(size_bytes);
    if (mapped == nullptr) throw std::bad_alloc();
    const size_t mapped_size = MappedSize(size_bytes);
    return std::shared_ptr<std::byte>(mapped, [mapped_size](std::byte* p) { ::munmap(p, mapped_size); });
  }
  const size_t rounded = std::max(kBufferAlignment, AlignedSize(size_bytes));
  auto* raw = static_cast<std::byte*>(::operator new (rounded, std::align_val_t{kBufferAlignment}));
  std::memset(raw, 0, rounded);
  return std::shared_ptr<std::byte>(raw,
                                    [](std::byte* p) { ::operator delete (p, std::align_val_t{kBufferAlignment}); });
}

namespace {

// Validates name, shape and byte count for a tensor about to join `set`.
Status CheckNewTensor(const std::unordered_map<std::string, size_t>& index, const std::string& name, DType dtype,
                      const std::vector<int64_t>& shape, size_t size_bytes) {
  if (name.empty()) return InvalidArgumentError("tensor name is empty");
  if (index.contains(name)) return InvalidArgumentError("tensor '" + name + "' already exists in the set");
  auto numel = NumElements(shape);
  if (!numel.ok()) return numel.status().WithContext("tensor '" + name + "'");
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(*numel), DTypeSize(dtype), &expected_bytes)) {
    return InvalidArgumentError("tensor '" + name + "' of shape " + ShapeString(shape) + " overflows 64-bit size");
  }
  if (expected_bytes != size_bytes) {
    return InvalidArgumentError("tensor '" + name + "' (" + std::string(DTypeName(dtype)) + ", shape " +
                                ShapeString(shape) + ") needs " + std::to_string(expected_bytes) + " bytes, got " +
                                std::to_string(size_bytes));
  }
  return Status::Ok();
}

// Index of the first non-finite element in `values` (interpreted via `is_non_finite`), or -1. The first pass is a
// branch-free OR-reduction over blocks so the common all-finite case vectorises; only a hit block is rescanned.
template <typename Bits, typename Pred>
int64_t FirstNonFinite(const std::byte* data, size_t count, Pred is_non_finite) {
  constexpr size_t kBlock = 4096;
  const Bits* values = reinterpret_cast<const Bits*>(data);
  for (size_t start = 0; start < count; start += kBlock) {
    size_t end = std::min(count, start + kBlock);
    bool any = false;
    for (size_t i = start; i < end; ++i) any |= is_non_finite(values[i]);
    if (!any) continue;
    for (size_t i = start; i < end; ++i) {
      if (is_non_finite(values[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 1;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32, DType::kI16,
                  DType::kI8, DType::kU8, DType::kBool}) {
    if (DTypeName(d) == name) return d;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "'");
}

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

StatusOr<int64_t> NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return InvalidArgumentError("shape " + ShapeString(shape) + " has a negative dimension");
    if (__builtin_mul_overflow(n, dim, &n)) {
      return InvalidArgumentError("shape " + ShapeString(shape) + " overflows int64 element count");
    }
  }
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

Status WeightSet::Add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> bytes) {
  PARSYN_RETURN_IF_ERROR(CheckNewTensor(index_, name, dtype, shape, bytes.size()));
  auto buffer = internal::AllocateZeroedBuffer(bytes.size());
  if (!bytes.empty()) std::memcpy(buffer.get(), bytes.data(), bytes.size());
  std::span<std::byte> data(buffer.get(), bytes.size());
  backing_.push_back(std::move(buffer));
  index_.emplace(name, tensors_.size());
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), data});
  return Status::Ok();
}

StatusOr<std::span<std::byte>> WeightSet::AddZeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  auto numel = NumElements(shape);
  if (!numel.ok()) return numel.status().WithContext("tensor '" + name + "'");
  uint64_t size_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(*numel), DTypeSize(dtype), &size_bytes)) {
    return InvalidArgumentError("tensor '" + name + "' of shape " + ShapeString(shape) + " overflows 64-bit size");
  }
  PARSYN_RETURN_IF_ERROR(CheckNewTensor(index_, name, dtype, shape, size_bytes));
  auto buffer = internal::AllocateZeroedBuffer(size_bytes);
  std::span<std::byte> data(buffer.get(), size_bytes);
  backing_.push_back(std::move(buffer));
  index_.emplace(name, tensors_.size());
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), data});
  return data;
}

Status WeightSet::AddView(std::string name, DType dtype, std::vector<int64_t> shape, std::span<std::byte> bytes,
                          std::shared_ptr<const void> backing) {
  PARSYN_RETURN_IF_ERROR(CheckNewTensor(index_, name, dtype, shape, bytes.size()));
  if (reinterpret_cast<uintptr_t>(bytes.data()) % DTypeSize(dtype) != 0) {
    return InvalidArgumentError("tensor '" + name + "' view is not aligned to its " + std::to_string(DTypeSize(dtype)) +
                                "-byte elements");
  }
  // Several views usually share one mapping; keep one reference to it.
  if (backing && (backing_.empty() || backing_.back() != backing)) backing_.push_back(std::move(backing));
  index_.emplace(name, tensors_.size());
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), bytes});
  return Status::Ok();
}

const Tensor* WeightSet::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t WeightSet::total_bytes() const {
  uint64_t total = 0;
  for (const Tensor& t : tensors_) total += t.data.size();
  return total;
}

void WeightSet::AddReadOnlyMapping(std::span<const std::byte> mapping) { read_only_mappings_.push_back(mapping); }

namespace {

bool Contains(std::span<const std::byte> outer, std::span<const std::byte> inner) {
  return inner.data() >= outer.data() && inner.data() + inner.size() <= outer.data() + outer.size();
}

}  // namespace

uint64_t WeightSet::pinned_bytes() const {
  uint64_t pinned = 0;
  for (const Tensor& t : tensors_) {
    const bool mapped = std::any_of(read_only_mappings_.begin(), read_only_mappings_.end(),
                                    [&](std::span<const std::byte> m) { return Contains(m, t.data); });
    if (!mapped) pinned += t.data.size();
  }
  return pinned;
}

void WeightSet::ReleasePages(std::span<const std::byte> bytes) const {
  if (bytes.empty()) return;
  const uintptr_t page = PageSize();
  // A fault on a file mapping also maps the cached pages around it (the kernel's fault-around, 64 KiB by default), so
  // reading `bytes` may have mapped pages up to that far on either side: they go too. A reader of those neighbours
  // that releases its own range (with the same margin) after its last read leaves nothing mapped behind.
  constexpr uintptr_t kFaultAroundBytes = uintptr_t{64} << 10;
  for (std::span<const std::byte> mapping : read_only_mappings_) {
    if (!Contains(mapping, bytes)) continue;
    // Rounded out to whole pages, within the mapping (it starts on a page; its last page is its own).
    const uintptr_t mapping_begin = reinterpret_cast<uintptr_t>(mapping.data());
    const uintptr_t mapping_end = (mapping_begin + mapping.size() + page - 1) / page * page;
    const uintptr_t first = reinterpret_cast<uintptr_t>(bytes.data());
    const uintptr_t begin = std::max(mapping_begin, (first - std::min(first, kFaultAroundBytes)) / page * page);
    const uintptr_t end = std::min(mapping_end, (first + bytes.size() + kFaultAroundBytes + page - 1) / page * page);
    // Read-only and shared: nothing private is lost, the pages are read again from the page cache when touched.
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    return;
  }
}

void WeightSet::ReleasePages() const {
  for (std::span<const std::byte> mapping : read_only_mappings_) ReleasePages(mapping);
}

void WeightSet::PopulatePages() const {
  for (std::span<const std::byte> mapping : read_only_mappings_) {
    // The mapping starts on a page boundary (mmap's); the length need not be a multiple of the page size.
    ::madvise(const_cast<std::byte*>(mapping.data()), mapping.size(), MADV_POPULATE_READ);
  }
}

WeightSet WeightSet::Clone() const {
  WeightSet copy;
  copy.metadata_ = metadata_;
  for (const Tensor& t : tensors_) {
    // Cannot fail: the tensor was validated when it joined this set.
    copy.Add(t.name, t.dtype, t.shape, t.data).IgnoreError();
  }
  return copy;
}

Status WeightSet::CheckSameLayout(const WeightSet& other) const { return CheckLayoutMatches(tensors_, other); }

Status CheckFinite(const WeightSet& set) {
  for (const Tensor& t : set.tensors()) {
    int64_t index = -1;
    double value = 0;
    const size_t count = t.data.size() / DTypeSize(t.dtype);
    switch (t.dtype) {
      case DType::kF32:
        index =
            FirstNonFinite<uint32_t>(t.data.data(), count, [](uint32_t b) { return (b & 0x7f800000u) == 0x7f800000u; });
        if (index >= 0) value = t.as<float>()[index];
        break;
      case DType::kF64:
        index = FirstNonFinite<uint64_t>(
            t.data.data(), count, [](uint64_t b) { return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull; });
        if (index >= 0) value = t.as<double>()[index];
        break;
      case DType::kBF16:
        index = FirstNonFinite<uint16_t>(t.data.data(), count, [](uint16_t b) { return (b & 0x7f80) == 0x7f80; });
        if (index >= 0) value = Bf16ToFloat(t.as<uint16_t>()[index]);
        break;
      case DType::kF16:
        index = FirstNonFinite<uint16_t>(t.data.data(), count, [](uint16_t b) { return (b & 0x7c00) == 0x7c00; });
        if (index >= 0) value = F16ToFloat(t.as<uint16_t>()[index]);
        break;
      default: break;
    }
    set.ReleasePages(t.data);  // a read-only mapped tensor's pages go once checked (a no-op for other memory)
    if (index >= 0) {
      const char* what = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
      return InvalidArgumentError("tensor '" + t.name + "' has a non-finite value (" + what + ") at index " +
                                  std::to_string(index));
    }
  }
  return Status::Ok();
}

float Bf16ToFloat(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

uint16_t FloatToBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Branch-light conversions after F. Giesen's "half_to_float_fast" / "float_to_half_fast3_rtne" (public domain).
float F16ToFloat(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;  // exponent mask after the shift
  uint32_t bits = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = kShiftedExp & bits;
  bits += (127 - 15) << 23;  // re-bias the exponent
  if (exp == kShiftedExp) {
    bits += (128 - 16) << 23;  // Inf/NaN: extra exponent adjustment
  } else if (exp == 0) {
    bits += 1 << 23;  // zero/subnormal: renormalise with one float subtraction
    bits = std::bit_cast<uint32_t>(std::bit_cast<float>(bits) - std::bit_cast<float>(113u << 23));
  }
  bits |= (static_cast<uint32_t>(h) & 0x8000u) << 16;
  return std::bit_cast<float>(bits);
}

uint16_t FloatToF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out;
  if (x >= 0x47800000u) {  // overflows to Inf, or is Inf/NaN
    out = x > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (x < 0x38800000u) {  // result is subnormal or zero: let one float addition do the RNE rounding
    constexpr uint32_t kDenormMagic = ((127 - 15) + (23 - 10) + 1) << 23;
    float rounded = std::bit_cast<float>(x) + std::bit_cast<float>(kDenormMagic);
    out = static_cast<uint16_t>(std::bit_cast<uint32_t>(rounded) - kDenormMagic);
  } else {
    const uint32_t mantissa_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // re-bias, rounding bias part 1
    x += mantissa_odd;                                      // rounding bias part 2 (ties to even)
    out = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

}  // namespace parsyn::weights
