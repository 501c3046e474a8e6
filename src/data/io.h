// Internal to src/data: buffered byte input over a std::istream and a std::streambuf over borrowed memory. Not part
// of the layer's interface.
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

}  // namespace parsyn::data::internal
