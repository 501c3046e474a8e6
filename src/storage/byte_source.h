// ByteSource: a readable stream of bytes, the unit blobs move in (HTTP bodies, files, blobs in a store).
//
// A ByteSource is used by one thread at a time. Read() is pull-based so a producer never has to hold a whole blob in
// memory: the blob store reads a request body chunk by chunk while it hashes and writes it.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn::storage {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Copies up to buffer.size() bytes into `buffer` and returns how many; 0 means the stream has ended (a source
  // returns 0 only at the end, never for "nothing yet"). Errors are the source's own (Unavailable for I/O errors).
  virtual StatusOr<size_t> Read(std::span<std::byte> buffer) = 0;
};

// A source over bytes it owns (tests, small JSON documents).
class StringByteSource final : public ByteSource {
 public:
  explicit StringByteSource(std::string bytes) : bytes_(std::move(bytes)) {}
  StatusOr<size_t> Read(std::span<std::byte> buffer) override;

 private:
  std::string bytes_;
  size_t offset_ = 0;
};

// Opens `path` for reading. NotFound if it does not exist or is not a regular file; Unavailable if it cannot be
// opened.
StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::filesystem::path& path);

// Reads `source` to its end into a string. ResourceExhausted if it holds more than `max_bytes`.
// For tests and small documents only; blobs are streamed, never read whole.
StatusOr<std::string> ReadAll(ByteSource& source, size_t max_bytes = size_t{64} << 20);

}  // namespace parsyn::storage
