// Atomic file writes: a reader sees the old file or the whole new one, never a part, also after a crash.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string_view>

#include "base/status.h"

namespace parsyn {

// Writes a file atomically: bytes go to a temporary file beside `destination`; Commit() fsyncs it and renames it
// over `destination`. A writer destroyed without Commit() removes its temporary file.
class AtomicFileWriter {
 public:
  // `mode`: the new file's permission bits (0600 for secrets), before a byte is written.
  static StatusOr<AtomicFileWriter> Open(const std::filesystem::path& destination, mode_t mode = 0644);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  ~AtomicFileWriter();

  Status Append(std::string_view bytes);
  // durable false: renamed into place without the fsyncs, for scratch files that nothing needs after a crash (a
  // reader still sees the whole file or none; after a machine crash it may be missing or hold other bytes).
  Status Commit(bool durable = true);

 private:
  AtomicFileWriter(std::filesystem::path destination, std::filesystem::path temporary, int fd)
      : destination_(std::move(destination)), temporary_(std::move(temporary)), fd_(fd) {}

  std::filesystem::path destination_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `destination` with AtomicFileWriter.
Status WriteFileAtomically(const std::filesystem::path& destination, std::string_view bytes, mode_t mode = 0644);

}  // namespace parsyn
