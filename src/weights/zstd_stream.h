// Streamed zstd over byte streams, both ways, in bounded chunks: the wire form of compressed updates and globals
// (docs/compression.md). Both directions are pull readers with ReadBytes' shape (storage::ByteSource's Read), so they
// chain: an HTTP body -> ZstdDecompressReader -> DecodeUpdate, or EncodeUpdate's bytes -> ZstdCompressReader -> an
// upload. Memory is O(chunk + zstd's window) whatever the stream's length.
//
// Decompression is bounded by the caller's max_output_bytes (the size the receiver expects, e.g. from the global's
// layout): a frame that declares more content is refused from its header, before any of it is expanded; a frame that
// does not declare its size is stopped as soon as the output passes the limit; zstd's window is capped to the limit
// rounded up to a power of two (a frame asking for more is refused from its header), so a hostile frame cannot make
// the decoder allocate more than about twice the limit plus zstd's fixed context (~95 KiB). ZstdCompressReader
// pledges the size when it knows it, so its frames declare their content and size their window to it.
// Every content error (not zstd, corrupt, truncated, too large) is InvalidArgument; the source's own errors pass
// through unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "weights/safetensors.h"

namespace parsyn::weights {

inline constexpr int kMaxZstdLevel = 19;

// Compresses what `raw` yields into one zstd frame. `level` 0..19 (0 is zstd's default, 3). When `pledged_size` is
// given the frame records its content size (the receiver's bomb check uses it) and zstd sizes its window to it;
// Read then fails (InvalidArgument) if `raw` yields a different number of bytes.
class ZstdCompressReader {
 public:
  static StatusOr<std::unique_ptr<ZstdCompressReader>> Create(ReadBytes raw, int level,
                                                              std::optional<uint64_t> pledged_size);
  ~ZstdCompressReader();
  ZstdCompressReader(const ZstdCompressReader&) = delete;
  ZstdCompressReader& operator=(const ZstdCompressReader&) = delete;

  // Up to buffer.size() compressed bytes; 0 once the frame is complete.
  StatusOr<size_t> Read(std::span<std::byte> buffer);

 private:
  struct Impl;
  explicit ZstdCompressReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Decompresses the zstd frames `compressed` yields (one or more, concatenated) into at most `max_output_bytes`.
class ZstdDecompressReader {
 public:
  ZstdDecompressReader(ReadBytes compressed, uint64_t max_output_bytes);
  ~ZstdDecompressReader();
  ZstdDecompressReader(const ZstdDecompressReader&) = delete;
  ZstdDecompressReader& operator=(const ZstdDecompressReader&) = delete;

  // Up to buffer.size() decompressed bytes; 0 at the end of the last frame. InvalidArgument when the input is not
  // zstd, is corrupt, ends inside a frame ("truncated"), a frame declares more content than the limit leaves, a
  // frame's window exceeds the cap, or the output would pass max_output_bytes.
  StatusOr<size_t> Read(std::span<std::byte> buffer);

  uint64_t bytes_out() const;
  // The most bytes zstd itself held allocated at once so far (its context, window and buffers), for tests and
  // benchmarks that check the decoder's memory is bounded by the limit.
  uint64_t peak_zstd_allocated_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A ReadBytes over bytes in memory (they must outlive it).
ReadBytes ReadFromSpan(std::span<const std::byte> bytes);
// A ReadBytes over a reader of this file (it must outlive the function).
template <typename Reader>
ReadBytes ReadFrom(Reader& reader) {
  return [&reader](std::span<std::byte> buffer) { return reader.Read(buffer); };
}

// Whole-buffer conveniences over the readers (tests, small documents).
StatusOr<std::vector<std::byte>> ZstdCompress(std::span<const std::byte> raw, int level);
StatusOr<std::vector<std::byte>> ZstdDecompress(std::span<const std::byte> compressed, uint64_t max_output_bytes);

}  // namespace parsyn::weights
