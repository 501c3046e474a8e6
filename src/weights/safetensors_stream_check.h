// Checks a safetensors image while its bytes stream past (an upload being written to the blob store), so the values
// need not be read a second time from the stored file: the header (bounded by SafetensorsLimits::max_header_bytes,
// checked by every rule of ReadSafetensorsHeader), that the data section ends where the last tensor does, and that
// every F32/BF16/F16/F64 value is finite (CheckFinite's rule). Bytes are fed in chunks of any size, split anywhere
// (inside the length prefix, the header or a value). Memory: the header, whatever the file's size.
// Not thread-safe: one thread feeds it at a time.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "weights/safetensors.h"

namespace parsyn::weights {

class SafetensorsStreamChecker {
 public:
  explicit SafetensorsStreamChecker(SafetensorsLimits limits = {});

  // Feeds the next bytes of the image. Never fails: the first problem found is kept for Finish, and the bytes after
  // it are only counted.
  void Update(std::span<const std::byte> bytes);

  // The verdict once the whole image was fed: OK when its header is valid, it ends exactly where its last tensor
  // does and every float value is finite. Else the first problem: as ReadSafetensorsHeader words it for the header
  // (InvalidArgument; DataLoss when the image ends inside it), InvalidArgument "tensor 'w' has a non-finite value
  // (nan) at index 17" as CheckFinite words it, DataLoss when the data section is cut short, InvalidArgument for
  // bytes after the last tensor.
  Status Finish() const;

  // The header's layout once it has been read and found valid; nullptr before, or if it was invalid.
  const SafetensorsLayout* layout() const { return layout_ ? &*layout_ : nullptr; }
  uint64_t bytes_seen() const { return bytes_seen_; }
  // The largest |value| among the F32/BF16/F16/F64 tensors' values seen (0 when none): once Finish is OK, the
  // update's magnitude bound, so an aggregation need not read the values again for it (WeightedMean::AcceptOwned).
  double max_magnitude() const { return max_magnitude_; }

 private:
  void TakeHeaderBytes(std::span<const std::byte>& bytes);
  void CheckData(std::span<const std::byte> bytes);
  // Checks whole elements of the current tensor; `first_index` is the index of bytes[0]'s element in the tensor.
  void CheckElements(std::span<const std::byte> bytes, uint64_t first_index);

  SafetensorsLimits limits_;
  uint64_t bytes_seen_ = 0;
  Status problem_;                 // the first problem found; OK while none
  std::vector<std::byte> header_;  // the length prefix and the header, until the header is parsed
  uint64_t header_total_ = 0;      // 8 + the header's length, once the prefix is in
  std::optional<SafetensorsLayout> layout_;
  size_t tensor_ = 0;                   // index in layout_->tensors of the tensor the data cursor is in
  uint64_t data_pos_ = 0;               // bytes of the data section seen
  std::array<std::byte, 8> partial_{};  // the start of an element split across chunks
  size_t partial_bytes_ = 0;
  double max_magnitude_ = 0;
};

}  // namespace parsyn::weights
