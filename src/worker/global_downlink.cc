#include "worker/global_downlink.h"

#include <fstream>
#include <map>
#include <vector>

#include "base/sha256.h"
#include "weights/safetensors.h"
#include "weights/update_wire.h"

namespace parsyn::worker {
namespace fs = std::filesystem;

namespace {

std::string JobPrefix(int64_t job_id) { return "job-" + std::to_string(job_id) + "-"; }
fs::path HeldFile(const fs::path& state_dir, int64_t job_id) {
  return state_dir / (JobPrefix(job_id) + "global.safetensors");
}
fs::path HeldShaFile(const fs::path& state_dir, int64_t job_id) {
  return state_dir / (JobPrefix(job_id) + "global.sha256");
}

}  // namespace

std::string HeldGlobalSha256(const fs::path& state_dir, int64_t job_id) {
  std::error_code ec;
  if (!fs::exists(HeldFile(state_dir, job_id), ec)) return "";
  std::ifstream in(HeldShaFile(state_dir, job_id));
  std::string sha256;
  in >> sha256;
  return sha256;
}

Status HoldGlobal(const fs::path& state_dir, int64_t job_id, const fs::path& global, const std::string& sha256) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  const fs::path held = HeldFile(state_dir, job_id), held_sha = HeldShaFile(state_dir, job_id);
  // The sha256 file goes first and comes back last, so it never names another file than the one in place.
  fs::remove(held_sha, ec);
  const fs::path temp = held.string() + ".tmp";
  fs::remove(temp, ec);
  fs::create_hard_link(global, temp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(global, temp, ec);
  }
  if (!ec) fs::rename(temp, held, ec);
  if (ec) return UnavailableError("cannot keep the job's global in " + state_dir.string() + ": " + ec.message());
  std::ofstream(held_sha) << sha256 << "\n";
  return Status::Ok();
}

Status UseHeldGlobal(const fs::path& state_dir, int64_t job_id, const fs::path& out) {
  std::error_code ec;
  fs::remove(out, ec);
  fs::create_hard_link(HeldFile(state_dir, job_id), out, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(HeldFile(state_dir, job_id), out, ec);
  }
  if (ec) return UnavailableError("cannot use the job's held global for " + out.string() + ": " + ec.message());
  return Status::Ok();
}

Status GlobalFromDelta(const protocol::TaskGlobalDelta& delta, const std::string& global_sha256,
                       const fs::path& state_dir, int64_t job_id, const fs::path& delta_file, const fs::path& out) {
  PARSYN_ASSIGN_OR_RETURN(weights::UpdateCodec codec, weights::ParseUpdateCodec(delta.codec));
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet base, weights::MapSafetensorsFileReadOnly(HeldFile(state_dir, job_id)));
  const weights::WireEncoding encoding{
      .codec = codec, .delta = true, .zstd_level = delta.zstd ? 1 : 0, .error_feedback = true};
  const std::map<std::string, std::string> metadata(delta.metadata.begin(), delta.metadata.end());
  PARSYN_RETURN_IF_ERROR(weights::WriteGlobalFromDelta(delta_file, base, encoding, metadata, out));
  PARSYN_ASSIGN_OR_RETURN(std::string got, Sha256File(out));
  if (got != global_sha256) {
    std::error_code ignored;
    fs::remove(out, ignored);
    return DataLossError("the global rebuilt from its delta has sha256 " + got + ", the task says " + global_sha256);
  }
  return Status::Ok();
}

void ForgetJob(const fs::path& state_dir, int64_t job_id) {
  std::error_code ec;
  const std::string prefix = JobPrefix(job_id);
  std::vector<fs::path> kept;
  for (fs::directory_iterator it(state_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with(prefix)) kept.push_back(it->path());
  }
  for (const fs::path& path : kept) fs::remove(path, ec);
}

}  // namespace parsyn::worker
