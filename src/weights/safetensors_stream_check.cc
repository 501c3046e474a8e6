#include "weights/safetensors_stream_check.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

namespace parsyn::weights {
namespace {

// Elements scanned per block before looking at the block's verdict: large enough for the loop to vectorise and run
// at memory speed, small enough that finding the index of a bad value rescans little.
constexpr size_t kBlockElements = 4096;

// The sign-cleared bit pattern of the value at p (unaligned).
template <typename Bits>
Bits MagnitudeBits(const std::byte* p, Bits magnitude_mask) {
  Bits v;
  std::memcpy(&v, p, sizeof(v));
  return v & magnitude_mask;
}

// Index of the first value in [p, p + count * sizeof(Bits)) whose sign-cleared bits reach `non_finite` (Inf or NaN
// for IEEE formats: the exponent all ones), or -1. Each block is one max-reduction, which vectorises; `max_bits` is
// raised to the largest sign-cleared pattern of the blocks found clean (the largest magnitude, for IEEE formats).
template <typename Bits>
int64_t FirstNonFiniteAndMaxBits(const std::byte* p, size_t count, Bits magnitude_mask, Bits non_finite,
                                 Bits& max_bits) {
  for (size_t block = 0; block < count; block += kBlockElements) {
    const size_t end = std::min(count, block + kBlockElements);
    Bits block_max = 0;
    for (size_t i = block; i < end; ++i)
      block_max = std::max(block_max, MagnitudeBits(p + i * sizeof(Bits), magnitude_mask));
    if (block_max < non_finite) {
      max_bits = std::max(max_bits, block_max);
      continue;
    }
    for (size_t i = block; i < end; ++i) {
      if (MagnitudeBits(p + i * sizeof(Bits), magnitude_mask) >= non_finite) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// Feeds `bytes` to `read` as a stream (ReadSafetensorsHeader's input).
ReadBytes ReaderOver(std::span<const std::byte> bytes, size_t& offset) {
  return [bytes, &offset](std::span<std::byte> out) -> StatusOr<size_t> {
    const size_t n = std::min(out.size(), bytes.size() - offset);
    std::memcpy(out.data(), bytes.data() + offset, n);
    offset += n;
    return n;
  };
}

}  // namespace

SafetensorsStreamChecker::SafetensorsStreamChecker(SafetensorsLimits limits) : limits_(limits) {}

void SafetensorsStreamChecker::Update(std::span<const std::byte> bytes) {
  bytes_seen_ += bytes.size();
  if (!problem_.ok()) return;
  if (!layout_) TakeHeaderBytes(bytes);
  if (layout_ && problem_.ok() && !bytes.empty()) CheckData(bytes);
}

void SafetensorsStreamChecker::TakeHeaderBytes(std::span<const std::byte>& bytes) {
  if (header_total_ == 0) {
    const size_t take = std::min(bytes.size(), kSafetensorsLengthPrefixBytes - header_.size());
    header_.insert(header_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
    bytes = bytes.subspan(take);
    if (header_.size() < kSafetensorsLengthPrefixBytes) return;
    uint64_t header_bytes = 0;
    for (size_t i = 0; i < kSafetensorsLengthPrefixBytes; ++i)
      header_bytes |= static_cast<uint64_t>(header_[i]) << (8 * i);
    if (header_bytes > limits_.max_header_bytes) {
      size_t offset = 0;  // the reader refuses the length before it reads any of the header: its own words
      problem_ = ReadSafetensorsHeader(ReaderOver(header_, offset), limits_).status();
      header_ = {};
      return;
    }
    header_total_ = kSafetensorsLengthPrefixBytes + header_bytes;  // grown as the bytes come, not reserved as claimed
  }
  const size_t take = std::min<uint64_t>(bytes.size(), header_total_ - header_.size());
  header_.insert(header_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
  bytes = bytes.subspan(take);
  if (header_.size() < header_total_) return;
  size_t offset = 0;
  StatusOr<SafetensorsLayout> layout = ReadSafetensorsHeader(ReaderOver(header_, offset), limits_);
  header_ = {};
  if (!layout.ok()) {
    problem_ = layout.status();
    return;
  }
  layout_ = std::move(*layout);
}

void SafetensorsStreamChecker::CheckData(std::span<const std::byte> bytes) {
  const std::vector<SafetensorsEntry>& tensors = layout_->tensors;
  while (!bytes.empty() && problem_.ok()) {
    while (tensor_ < tensors.size() && data_pos_ >= tensors[tensor_].end) ++tensor_;
    if (tensor_ == tensors.size()) return;  // trailing bytes: counted, and Finish says so
    const SafetensorsEntry& t = tensors[tensor_];
    std::span<const std::byte> piece = bytes.first(std::min<uint64_t>(bytes.size(), t.end - data_pos_));
    bytes = bytes.subspan(piece.size());
    const uint64_t piece_pos = data_pos_;
    data_pos_ += piece.size();
    const bool checked =
        t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kF64;
    if (!checked) continue;
    const size_t element = DTypeSize(t.dtype);
    uint64_t pos = piece_pos;
    if (partial_bytes_ > 0) {  // completes the element the previous chunk ended inside
      const size_t fill = std::min(element - partial_bytes_, piece.size());
      std::memcpy(partial_.data() + partial_bytes_, piece.data(), fill);
      partial_bytes_ += fill;
      piece = piece.subspan(fill);
      pos += fill;
      if (partial_bytes_ < element) continue;
      partial_bytes_ = 0;
      CheckElements(std::span<const std::byte>(partial_.data(), element), (pos - 1 - t.begin) / element);
      if (!problem_.ok()) return;
    }
    const size_t whole = piece.size() / element * element;
    CheckElements(piece.first(whole), (pos - t.begin) / element);
    partial_bytes_ = piece.size() - whole;
    std::memcpy(partial_.data(), piece.data() + whole, partial_bytes_);
  }
}

void SafetensorsStreamChecker::CheckElements(std::span<const std::byte> bytes, uint64_t first_index) {
  const SafetensorsEntry& t = layout_->tensors[tensor_];
  const std::byte* p = bytes.data();
  const size_t count = bytes.size() / DTypeSize(t.dtype);
  int64_t bad = -1;
  bool nan = false, negative = false;
  switch (t.dtype) {
    case DType::kF32: {
      int32_t max_bits = 0;
      bad = FirstNonFiniteAndMaxBits<int32_t>(p, count, 0x7fffffff, 0x7f800000, max_bits);
      if (bad >= 0) nan = MagnitudeBits<int32_t>(p + bad * 4, 0x7fffffff) > 0x7f800000;
      max_magnitude_ = std::max<double>(max_magnitude_, std::bit_cast<float>(max_bits));
      break;
    }
    case DType::kBF16: {
      int16_t max_bits = 0;
      bad = FirstNonFiniteAndMaxBits<int16_t>(p, count, 0x7fff, 0x7f80, max_bits);
      if (bad >= 0) nan = MagnitudeBits<int16_t>(p + bad * 2, 0x7fff) > 0x7f80;
      max_magnitude_ = std::max<double>(max_magnitude_, Bf16ToFloat(static_cast<uint16_t>(max_bits)));
      break;
    }
    case DType::kF16: {
      int16_t max_bits = 0;
      bad = FirstNonFiniteAndMaxBits<int16_t>(p, count, 0x7fff, 0x7c00, max_bits);
      if (bad >= 0) nan = MagnitudeBits<int16_t>(p + bad * 2, 0x7fff) > 0x7c00;
      max_magnitude_ = std::max<double>(max_magnitude_, F16ToFloat(static_cast<uint16_t>(max_bits)));
      break;
    }
    case DType::kF64: {
      int64_t max_bits = 0;
      bad = FirstNonFiniteAndMaxBits<int64_t>(p, count, 0x7fffffffffffffff, 0x7ff0000000000000, max_bits);
      if (bad >= 0) nan = MagnitudeBits<int64_t>(p + bad * 8, 0x7fffffffffffffff) > 0x7ff0000000000000;
      max_magnitude_ = std::max(max_magnitude_, std::bit_cast<double>(max_bits));
      break;
    }
    default: return;
  }
  if (bad < 0) return;
  // Little-endian: the sign is the top bit of the element's last byte.
  const size_t element = DTypeSize(t.dtype);
  negative = (static_cast<uint8_t>(p[(bad + 1) * element - 1]) & 0x80) != 0;
  const char* what = nan ? "nan" : (negative ? "-inf" : "inf");
  problem_ = InvalidArgumentError("tensor '" + t.name + "' has a non-finite value (" + what + ") at index " +
                                  std::to_string(first_index + static_cast<uint64_t>(bad)));
}

Status SafetensorsStreamChecker::Finish() const {
  if (!problem_.ok()) return problem_;
  if (!layout_) {
    size_t offset = 0;  // the header never completed: the reader's words for a stream that ends inside it
    Status cut = ReadSafetensorsHeader(ReaderOver(header_, offset), limits_).status();
    return cut.ok() ? DataLossError("stream ends before the header does") : cut;
  }
  const std::vector<SafetensorsEntry>& tensors = layout_->tensors;
  const uint64_t data_bytes = tensors.empty() ? 0 : tensors.back().end;
  const uint64_t expected = layout_->data_start + data_bytes;
  if (bytes_seen_ < expected) {
    size_t cut_in = tensor_;
    while (tensors[cut_in].end <= data_pos_) ++cut_in;  // the cursor moves on lazily; some tensor ends past it
    return DataLossError("stream ends after " + std::to_string(bytes_seen_) + " bytes, inside tensor '" +
                         tensors[cut_in].name + "' (the header says the data section ends at byte " +
                         std::to_string(expected) + ")");
  }
  if (bytes_seen_ > expected) {
    return InvalidArgumentError(std::to_string(bytes_seen_ - expected) + " trailing bytes after the last tensor" +
                                (tensors.empty() ? std::string() : " '" + tensors.back().name + "'"));
  }
  return Status::Ok();
}

}  // namespace parsyn::weights
