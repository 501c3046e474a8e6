// SignedBlobUrls: the coordinator's own BlobUrlIssuer, for blob stores that issue no URLs (the directory store):
// URLs of the coordinator's `/blobs/<key>` route signed with the URL-signing secret (http/signed_url.h), which
// blob_routes.cc checks. Uploads through them pass the coordinator, which counts their bytes.
//
// URLs put in a worker's task are bound to that worker: they carry `worker=<id>` and the signature covers it
// (WorkerBoundKey), so blob_routes.cc refuses them (403) once the worker is revoked, before they expire.
//
// Threads: any; the public URL is read through the function given (the service may learn it after Open).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "storage/blob_urls.h"

namespace parsyn::coordinator {

// What a URL bound to `worker_id` signs in place of the blob key: "<key>\nworker <id>". Blob keys hold no newline
// (storage::ValidateBlobKey), so a bound signature never passes for an unbound URL of the key, nor the reverse.
std::string WorkerBoundKey(std::string_view key, int64_t worker_id);

// "<public_url>/blobs/<key>?expires=...&signature=..." for `method`, expiring at expires_unix_s; with a worker id,
// "?worker=<id>&expires=...", signed over WorkerBoundKey.
std::string SignedBlobUrl(std::string_view secret, std::string_view public_url, std::string_view method,
                          std::string_view key, int64_t expires_unix_s,
                          std::optional<int64_t> worker_id = std::nullopt);

class SignedBlobUrls final : public storage::BlobUrlIssuer {
 public:
  SignedBlobUrls(std::string secret, std::function<std::string()> public_url, const Clock& clock);

  StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds ttl) const override;
  StatusOr<storage::UrlGrant> PutGrant(std::string_view key, std::chrono::seconds ttl) const override;
  std::chrono::seconds max_ttl() const override { return std::chrono::seconds::max(); }
  bool transfers_bypass_coordinator() const override { return false; }

  // The signed URL of `method` on `key`, valid for `ttl`; bound to `worker_id` when given.
  std::string Sign(std::string_view method, std::string_view key, std::chrono::seconds ttl,
                   std::optional<int64_t> worker_id = std::nullopt) const;

 private:
  std::string secret_;
  std::function<std::string()> public_url_;
  const Clock& clock_;
};

}  // namespace parsyn::coordinator
