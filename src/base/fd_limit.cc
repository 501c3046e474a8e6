#include "base/fd_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace parsyn {

StatusOr<OpenFilesLimit> RaiseOpenFilesLimit(uint64_t cap) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return UnavailableError(std::string("reading the open-files limit: ") + std::strerror(errno));
  }
  OpenFilesLimit out{.before = limit.rlim_cur, .after = limit.rlim_cur, .hard = limit.rlim_max};
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) {
    // The kernel refuses more than fs.nr_open descriptors whatever the hard limit says.
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    uint64_t most = 1 << 20;
    nr_open >> most;
    target = static_cast<rlim_t>(most);
  }
  if (cap != 0 && target > cap) target = cap;
  if (target <= limit.rlim_cur) return out;
  limit.rlim_cur = target;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return UnavailableError("raising the open-files limit from " + std::to_string(out.before) + " to " +
                            std::to_string(target) + ": " + std::strerror(errno));
  }
  out.after = target;
  return out;
}

}  // namespace parsyn
