// The one error for a write the file system refused for lack of space (ENOSPC, or EDQUOT: a quota), from the blob
// store and the metadata store alike, so what failed (an upload, a round, a job's record) says so and what to do.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn::storage {

inline bool IsDiskFullErrno(int err) { return err == ENOSPC || err == EDQUOT; }

// What a disk-full error advises: true of a running job's failed round, which is retried.
inline constexpr std::string_view kDiskFullAdvice = ", free space and the job resumes";

// Unavailable (transient: a failed round is retried, and succeeds once there is space again):
// "disk full: <path> (<detail>), free space and the job resumes".
inline Status DiskFullError(std::string_view path, std::string_view detail) {
  return UnavailableError("disk full: " + std::string(path) + " (" + std::string(detail) + ")" +
                          std::string(kDiskFullAdvice));
}

}  // namespace parsyn::storage
