// The process's open-files limit (RLIMIT_NOFILE): a coordinator holds a connection or two per worker, so the
// default soft limit (often 1024) caps it far below the hard limit the system allows.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace parsyn {

struct OpenFilesLimit {
  uint64_t before = 0;  // the soft limit found
  uint64_t after = 0;   // the soft limit now (the hard limit, or `before` when it already was)
  uint64_t hard = 0;
};

// Raises the soft RLIMIT_NOFILE to the hard limit (capped at `cap`, 0: no cap). Unavailable if the system refuses.
StatusOr<OpenFilesLimit> RaiseOpenFilesLimit(uint64_t cap = 0);

}  // namespace parsyn
