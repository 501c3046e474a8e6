#include "base/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/strings.h"

namespace parsyn {

StatusOr<std::string> SecureRandomHex(size_t bytes) {
  std::vector<unsigned char> buffer(bytes);
  size_t got = 0;
  while (got < buffer.size()) {
    const ssize_t n = ::getrandom(buffer.data() + got, buffer.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return HexEncode(std::span<const unsigned char>(buffer.data(), buffer.size()));
}

}  // namespace parsyn
