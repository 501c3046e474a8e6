#include "data/io.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

namespace parsyn::data::internal {

bool BufferedInput::Refill() {
  if (!in_.good()) return false;
  in_.read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  pos_ = 0;
  end_ = static_cast<size_t>(in_.gcount());
  return end_ > 0;
}

Status CheckReadable(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("no file at " + path.string());
  if (std::filesystem::is_directory(path, ec)) return InvalidArgumentError(path.string() + " is a directory");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) return UnavailableError("cannot open " + path.string() + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace parsyn::data::internal
