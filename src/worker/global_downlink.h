// The downlink on the worker (docs/compression.md, "Downlink"): the last global of each job the worker trains, kept in
// its state folder (WorkerStateDir, beside error feedback's residuals), and a task's global rebuilt from its delta
// against that one. Everything kept for a job goes when the coordinator says the job ended (ForgetJob) and when the
// worker starts (its state folder is cleared).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "base/status.h"
#include "protocol/messages.h"

namespace parsyn::worker {

// The sha256 of job `job_id`'s held global; empty when the worker holds none for it.
std::string HeldGlobalSha256(const std::filesystem::path& state_dir, int64_t job_id);

// Keeps `global` (a task's global, its sha256 checked) as job `job_id`'s held global, in place of the one before: a
// hard link to it (a copy where links fail), then its sha256 beside it.
Status HoldGlobal(const std::filesystem::path& state_dir, int64_t job_id, const std::filesystem::path& global,
                  const std::string& sha256);

// Links (or copies) job `job_id`'s held global to `out`: for a task whose global the worker holds already (a round
// retried after a failed attempt). Unavailable when that fails.
Status UseHeldGlobal(const std::filesystem::path& state_dir, int64_t job_id, const std::filesystem::path& out);

// Writes a task's global to `out` from its delta (`delta_file`, downloaded and checked against delta.sha256) and
// job `job_id`'s held global (its sha256 is delta.base_sha256: the caller checked). InvalidArgument for a delta that
// does not decode (non-finite values included), DataLoss when the result's sha256 is not `global_sha256`; nothing is
// left at `out` then.
Status GlobalFromDelta(const protocol::TaskGlobalDelta& delta, const std::string& global_sha256,
                       const std::filesystem::path& state_dir, int64_t job_id, const std::filesystem::path& delta_file,
                       const std::filesystem::path& out);

// Removes what the worker keeps for job `job_id`: its held global and its error-feedback residual.
void ForgetJob(const std::filesystem::path& state_dir, int64_t job_id);

}  // namespace parsyn::worker
