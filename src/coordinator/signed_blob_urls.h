// SignedBlobUrls: the coordinator's own BlobUrlIssuer, for blob stores that issue no URLs (the directory store):
// URLs of the coordinator's `/blobs/<key>` route signed with the URL-signing secret (http/signed_url.h), which
// blob_routes.cc checks. Uploads through them pass the coordinator, which counts their bytes.
//
// Threads: any; the public URL is read through the function given (the service may learn it after Open).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "storage/blob_urls.h"

namespace parsyn::coordinator {

// "<public_url>/blobs/<key>?expires=...&signature=..." for `method`, expiring at expires_unix_s.
std::string SignedBlobUrl(std::string_view secret, std::string_view public_url, std::string_view method,
                          std::string_view key, int64_t expires_unix_s);

class SignedBlobUrls final : public storage::BlobUrlIssuer {
 public:
  SignedBlobUrls(std::string secret, std::function<std::string()> public_url, const Clock& clock);

  StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds ttl) const override;
  StatusOr<storage::UrlGrant> PutGrant(std::string_view key, std::chrono::seconds ttl) const override;
  std::chrono::seconds max_ttl() const override { return std::chrono::seconds::max(); }
  bool transfers_bypass_coordinator() const override { return false; }

  // The signed URL of `method` on `key`, valid for `ttl`.
  std::string Sign(std::string_view method, std::string_view key, std::chrono::seconds ttl) const;

 private:
  std::string secret_;
  std::function<std::string()> public_url_;
  const Clock& clock_;
};

}  // namespace parsyn::coordinator
