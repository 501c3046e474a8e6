// Blob downloads for the worker: every file arrives through a signed URL, is written under a temporary name, checked
// against the sha256 the coordinator sent, and only then renamed into place, so a path that exists is whole and
// verified. Model files are kept by checksum in the cache directory, so a base model is fetched once across rounds
// and jobs (and shared by workers pointed at the same cache: temporary names are unique per process and thread).
//
// Layout under the cache root:   blobs/<sha256>            verified files, named by content
//                                models/<key>/<path>       a model folder of hard links into blobs/ (key: sha256
//                                                          over the files' paths and checksums)
//                                shards/<key>.<csv|jsonl>  a shard's training then validation rows (key: sha256
//                                                          over its two files' checksums; agent.cc)
// Threads: one BlobCache per thread; different processes may share a root.
#pragma once

#include <filesystem>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "http/client.h"
#include "protocol/messages.h"

namespace parsyn::worker {

// GETs `url` into `dest` and checks its sha256 (skipped when `sha256` is empty). On a mismatch: DataLoss naming the
// file (`name`, e.g. "shard 2's training file"; default: dest's file name), the expected and the actual sha256, and
// nothing is left at `dest` (the download is removed). The client's errors otherwise (Unavailable, NotFound...).
Status DownloadVerified(http::Client& client, const std::string& url, const std::filesystem::path& dest,
                        const std::string& sha256, std::stop_token stop = {}, std::string_view name = {});

// Creates the cache root (and missing parents) if absent, the root itself with mode 0700: it holds the job's shards,
// its global weights and the worker's updates, which other local users must not read. An existing directory keeps
// its mode (it may be one the user chose to share). Internal naming the path on failure.
Status CreateCacheRoot(const std::filesystem::path& root);

class BlobCache {
 public:
  explicit BlobCache(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }

  // The cached blob with this checksum, downloaded from `url` when absent. InvalidArgument for a checksum that is
  // not 64 hex digits; DownloadVerified's errors.
  StatusOr<std::filesystem::path> Fetch(http::Client& client, const std::string& url, const std::string& sha256,
                                        std::stop_token stop = {}, std::string_view name = {});
  // A model folder holding `files` (the task's model.files). InvalidArgument for an empty list or a path that
  // leaves the folder; Fetch's errors.
  StatusOr<std::filesystem::path> FetchModel(http::Client& client, const std::vector<protocol::TaskModelFile>& files,
                                             std::stop_token stop = {});

 private:
  std::filesystem::path root_;
};

// A name beside `dest` that no other process or thread uses ("<dest>.tmp-<pid>-<thread>").
std::filesystem::path UniqueTempPath(const std::filesystem::path& dest);

}  // namespace parsyn::worker
