#include "coordinator/signed_blob_urls.h"

#include "http/signed_url.h"

namespace parsyn::coordinator {

std::string WorkerBoundKey(std::string_view key, int64_t worker_id) {
  return std::string(key) + "\nworker " + std::to_string(worker_id);
}

std::string SignedBlobUrl(std::string_view secret, std::string_view public_url, std::string_view method,
                          std::string_view key, int64_t expires_unix_s, std::optional<int64_t> worker_id) {
  std::string url = std::string(public_url) + "/blobs/" + std::string(key) + "?";
  if (!worker_id) return url + http::SignUrl(secret, method, key, expires_unix_s);
  return url + "worker=" + std::to_string(*worker_id) + "&" +
         http::SignUrl(secret, method, WorkerBoundKey(key, *worker_id), expires_unix_s);
}

SignedBlobUrls::SignedBlobUrls(std::string secret, std::function<std::string()> public_url, const Clock& clock)
    : secret_(std::move(secret)), public_url_(std::move(public_url)), clock_(clock) {}

std::string SignedBlobUrls::Sign(std::string_view method, std::string_view key, std::chrono::seconds ttl,
                                 std::optional<int64_t> worker_id) const {
  const int64_t expires = clock_.UnixMillis() / 1000 + ttl.count();
  return SignedBlobUrl(secret_, public_url_(), method, key, expires, worker_id);
}

StatusOr<std::string> SignedBlobUrls::GetUrl(std::string_view key, std::chrono::seconds ttl) const {
  return Sign("GET", key, ttl);
}

StatusOr<storage::UrlGrant> SignedBlobUrls::PutGrant(std::string_view key, std::chrono::seconds ttl) const {
  return storage::UrlGrant{.url = Sign("PUT", key, ttl), .headers = {}};
}

}  // namespace parsyn::coordinator
