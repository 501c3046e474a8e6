// BlobUrlIssuer: URLs that let a holder without credentials (a worker) read or write one blob. An optional
// capability of a blob store (BlobStore::url_issuer()): an S3 store presigns its own URLs; for the directory store
// the coordinator issues signed `/blobs/...` URLs of its own (coordinator/signed_blob_urls.h), since only it serves
// them. MultipartUrlIssuer: uploads in parts through part URLs, for stores that have them (S3).
//
// Presigning is local: GetUrl, PutGrant and PartGrant never contact the store. The multipart calls that say
// "blocking" do: keep them off the event loop. Safe to call from several threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "storage/blob_store.h"

namespace parsyn::storage {

// A URL and the headers its holder must send with it, exactly as they are (they may be signed).
struct UrlGrant {
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
};

class MultipartUrlIssuer;

class BlobUrlIssuer {
 public:
  virtual ~BlobUrlIssuer() = default;

  // A GET URL of blob `key`, valid for `ttl`.
  virtual StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds ttl) const = 0;
  // A create-only PUT of blob `key`, valid for `ttl`.
  virtual StatusOr<UrlGrant> PutGrant(std::string_view key, std::chrono::seconds ttl) const = 0;
  // The longest `ttl` accepted.
  virtual std::chrono::seconds max_ttl() const = 0;
  // True when holders move the bytes straight to the store: the coordinator sees none of them pass.
  virtual bool transfers_bypass_coordinator() const = 0;
  // Multipart uploads through part URLs; null when the store has none.
  virtual MultipartUrlIssuer* multipart() { return nullptr; }
};

class MultipartUrlIssuer {
 public:
  virtual ~MultipartUrlIssuer() = default;

  // Uploads larger than this should go in parts, of part_size_bytes each (the last may be smaller).
  virtual uint64_t multipart_threshold_bytes() const = 0;
  virtual uint64_t part_size_bytes() const = 0;
  // Blocking: starts an upload of `key` (nothing is visible until CompleteUpload) and returns its id.
  virtual StatusOr<std::string> StartUpload(std::string_view key) = 0;
  // A PUT of part `part_number` (1..10000) of the upload, valid for `ttl`.
  virtual StatusOr<UrlGrant> PartGrant(std::string_view key, std::string_view upload_id, int part_number,
                                       std::chrono::seconds ttl) const = 0;
  // Blocking: completes the upload with every part received, create-only (AlreadyExists if `key` is taken).
  virtual StatusOr<BlobInfo> CompleteUpload(std::string_view key, std::string_view upload_id) = 0;
  // Blocking: discards the parts of every upload under `prefix` that was never completed; returns how many.
  virtual StatusOr<int> AbortUploadsUnder(std::string_view prefix) = 0;
};

}  // namespace parsyn::storage
