#include "base/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/strings.h"

namespace parsyn {

Status SecureRandomBytes(std::span<unsigned char> out) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

StatusOr<std::string> SecureRandomHex(size_t bytes) {
  std::vector<unsigned char> buffer(bytes);
  PARSYN_RETURN_IF_ERROR(SecureRandomBytes(buffer));
  return HexEncode(std::span<const unsigned char>(buffer.data(), buffer.size()));
}

}  // namespace parsyn
