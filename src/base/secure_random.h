// Secrets from the kernel's random source (getrandom): tokens, keys, a job's private seed. Safe from any thread.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "base/status.h"

namespace parsyn {

// Fills `out` from getrandom(). Unavailable if the kernel has no randomness to give.
Status SecureRandomBytes(std::span<unsigned char> out);

// `bytes` random bytes from getrandom() as lowercase hex. Unavailable if the kernel has no randomness to give.
StatusOr<std::string> SecureRandomHex(size_t bytes);

}  // namespace parsyn
