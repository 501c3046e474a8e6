// Helpers shared by the worker agent's two files (agent.cc: the session; agent_task.cc: one task). Not for other users.
#pragma once

#include <cstdint>
#include <filesystem>

#include "base/status.h"

namespace parsyn::worker {

// Error feedback's residuals, one file per job, kept between this worker's tasks of the job (docs/compression.md,
// "In jobs"). Cleared when the worker starts: a restarted worker's residual starts from zero.
std::filesystem::path WorkerStateDir(const std::filesystem::path& cache_root, int64_t worker_id);

// Counts the data lines of a text file (CSV: without its header line).
StatusOr<int64_t> CountRows(const std::filesystem::path& path, bool has_header);

}  // namespace parsyn::worker
