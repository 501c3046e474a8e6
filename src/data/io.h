// Internal to src/data: buffered byte input over a std::istream, a std::streambuf over borrowed memory, and atomic
// file writes. Not part of the layer's interface.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::data::internal {

// Reads a std::istream in 64 KiB blocks so per-byte access costs no virtual call.
class BufferedInput {
 public:
  explicit BufferedInput(std::istream& in) : in_(in), buffer_(64 * 1024) {}

  // The next byte (0..255) without consuming it, or -1 at the end of the stream.
  int Peek() {
    if (pos_ == end_ && !Refill()) return -1;
    return static_cast<unsigned char>(buffer_[pos_]);
  }
  int Get() {
    int c = Peek();
    if (c >= 0) {
      ++pos_;
      ++consumed_;
    }
    return c;
  }
  uint64_t consumed() const { return consumed_; }
  // True when the stream failed for a reason other than reaching its end.
  bool failed() const { return in_.bad(); }

 private:
  bool Refill();

  std::istream& in_;
  std::vector<char> buffer_;
  size_t pos_ = 0;
  size_t end_ = 0;
  uint64_t consumed_ = 0;
};

// A read-only streambuf over memory the caller keeps alive.
class MemoryStreambuf : public std::streambuf {
 public:
  explicit MemoryStreambuf(std::string_view bytes) {
    char* begin = const_cast<char*>(bytes.data());  // never written through: this buffer has no put area
    setg(begin, begin, begin + bytes.size());
  }
};

// Opens `path` for reading: NotFound when it does not exist, Unavailable for other failures.
Status CheckReadable(const std::filesystem::path& path);

// Writes a file atomically: bytes go to a temporary file beside `destination`; Commit() fsyncs it and renames it
// over `destination`. A writer destroyed without Commit() removes its temporary file.
class AtomicFileWriter {
 public:
  static StatusOr<AtomicFileWriter> Open(const std::filesystem::path& destination);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  ~AtomicFileWriter();

  Status Append(std::string_view bytes);
  Status Commit();

 private:
  AtomicFileWriter(std::filesystem::path destination, std::filesystem::path temporary, int fd)
      : destination_(std::move(destination)), temporary_(std::move(temporary)), fd_(fd) {}

  std::filesystem::path destination_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `destination` with AtomicFileWriter.
Status WriteFileAtomically(const std::filesystem::path& destination, std::string_view bytes);

}  // namespace parsyn::data::internal
