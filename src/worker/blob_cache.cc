#include "worker/blob_cache.h"

#include <unistd.h>

#include <functional>
#include <system_error>
#include <thread>

#include "base/sha256.h"

namespace parsyn::worker {

namespace fs = std::filesystem;

namespace {

bool IsHexSha256(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status CreateDirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir.string() + ": " + ec.message());
  return Status::Ok();
}

// A model file's path: relative, no "..", no empty or "." parts.
bool IsSafeRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/') return false;
  for (const auto& part : fs::path(path)) {
    if (part == ".." || part == "." || part.empty()) return false;
  }
  return true;
}

}  // namespace

Status CreateCacheRoot(const fs::path& root) {
  std::error_code ec;
  if (fs::is_directory(root, ec)) return Status::Ok();
  fs::create_directories(root, ec);
  if (!ec) fs::permissions(root, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) return InternalError("cannot create the cache directory " + root.string() + ": " + ec.message());
  return Status::Ok();
}

fs::path UniqueTempPath(const fs::path& dest) {
  const size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1'000'000;
  return fs::path(dest.string() + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(thread));
}

Status DownloadVerified(http::Client& client, const std::string& url, const fs::path& dest, const std::string& sha256,
                        std::stop_token stop, std::string_view name) {
  PARSYN_RETURN_IF_ERROR(CreateDirs(dest.parent_path()));
  const fs::path temp = UniqueTempPath(dest);
  http::CallOptions call;
  call.stop = stop;
  StatusOr<uint64_t> bytes = client.DownloadToFile(url, temp, call);
  if (!bytes.ok()) return bytes.status();
  std::error_code ec;
  if (!sha256.empty()) {
    StatusOr<std::string> actual = Sha256File(temp);
    if (!actual.ok() || *actual != sha256) {
      fs::remove(temp, ec);
      if (!actual.ok()) return actual.status();
      const std::string file = name.empty() ? dest.filename().string() : std::string(name);
      return DataLossError(file + " arrived with sha256 " + *actual + ", expected " + sha256 +
                           " (the task's); the download was removed");
    }
  }
  fs::rename(temp, dest, ec);
  if (ec) {
    fs::remove(temp, ec);
    return InternalError("cannot move the download into " + dest.string() + ": " + ec.message());
  }
  return Status::Ok();
}

StatusOr<fs::path> BlobCache::Fetch(http::Client& client, const std::string& url, const std::string& sha256,
                                    std::stop_token stop, std::string_view name) {
  if (!IsHexSha256(sha256))
    return InvalidArgumentError("blob checksum '" + sha256 + "' is not 64 lowercase hex digits");
  const fs::path dest = root_ / "blobs" / sha256;
  if (fs::exists(dest)) return dest;
  PARSYN_RETURN_IF_ERROR(DownloadVerified(client, url, dest, sha256, stop, name));
  return dest;
}

StatusOr<fs::path> BlobCache::FetchModel(http::Client& client, const std::vector<protocol::TaskModelFile>& files,
                                         std::stop_token stop) {
  if (files.empty()) return InvalidArgumentError("the task's model has no files");
  std::string key_text;
  for (const protocol::TaskModelFile& f : files) {
    if (!IsSafeRelativePath(f.path)) {
      return InvalidArgumentError("model file path '" + f.path + "' leaves the model folder");
    }
    key_text += f.path + "\n" + f.sha256 + "\n";
  }
  const fs::path dir = root_ / "models" / Sha256Hex(key_text);
  if (fs::exists(dir)) return dir;
  const fs::path temp = UniqueTempPath(dir);
  std::error_code ec;
  fs::remove_all(temp, ec);
  for (const protocol::TaskModelFile& f : files) {
    PARSYN_ASSIGN_OR_RETURN(fs::path blob, Fetch(client, f.url, f.sha256, stop, "model file " + f.path));
    const fs::path target = temp / f.path;
    PARSYN_RETURN_IF_ERROR(CreateDirs(target.parent_path()));
    fs::create_hard_link(blob, target, ec);
    if (ec) fs::copy_file(blob, target, ec);  // a cache on a file system without hard links
    if (ec) return InternalError("cannot place " + target.string() + ": " + ec.message());
  }
  fs::rename(temp, dir, ec);
  if (ec && !fs::exists(dir)) return InternalError("cannot move the model into " + dir.string() + ": " + ec.message());
  fs::remove_all(temp, ec);  // another process placed the same model first
  return dir;
}

}  // namespace parsyn::worker
