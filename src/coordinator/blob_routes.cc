// /blobs/{key...}: GET or PUT one blob with a signed URL (http/signed_url.h), the only credential workers use for
// weights and data. PUT is create-only and capped at the size the key's job allows. A URL bound to a worker
// (`worker=<id>` in its signed part: signed_blob_urls.h) is refused (403) once that worker is revoked. With mutual
// TLS (ServiceOptions::require_worker_certificates) a bound URL also needs that worker's client certificate.
//
// Round updates cannot starve each other's uploads (each holds an upload-pool thread while it streams): at most one
// PUT per key is in flight (a second one gets 409 while the first runs), at most
// ServiceOptions::max_uploads_per_worker per worker the URL was issued to (429 with Retry-After beyond it), and a
// body slower than ServiceOptions::upload_min_rate is cut off (http::BodyRate), its partial blob discarded.
//
// GET answers carry `X-Content-Type-Options: nosniff` and `Content-Disposition: attachment`, so a browser never
// renders a blob (an uploaded file) as a page of the coordinator's origin.
#include <charconv>
#include <map>
#include <set>

#include "base/log.h"
#include "base/strings.h"
#include "coordinator/auth.h"
#include "coordinator/job_runner.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "coordinator/signed_blob_urls.h"
#include "http/signed_url.h"
#include "loop/loop_tools.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;

namespace {

// The job id of a "jobs/<id>/..." key, if it is one.
std::optional<int64_t> JobOfKey(std::string_view key) {
  constexpr std::string_view kPrefix = "jobs/";
  if (key.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  key.remove_prefix(kPrefix.size());
  int64_t id = 0;
  auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec != std::errc() || end == key.data() + key.size() || *end != '/') return std::nullopt;
  return id;
}

// A store's error as a worker (or any holder of a signed URL) is answered it: without the server's file paths ("disk
// full: /var/lib/parsyn/blobs/..." reads "disk full: ..."); the server's log keeps them whole.
Response ErrorForWorker(const Status& status) {
  PARSYN_LOG_WARN("blob transfer failed: {}", status.ToString());
  return Response::Error(Status(status.code(), WithoutLocalPaths(status.message())));
}

class BlobRoutes {
 public:
  BlobRoutes(const RouteContext& context, Service& service, std::string signing_secret)
      : context_(context), service_(service), signing_secret_(std::move(signing_secret)) {}

  Awaitable<Response> Get(Request& req) {
    const std::string key = req.params["key"];
    auto allowed = Verify(req, "GET", key);
    if (!allowed.ok()) co_return Response::Error(allowed.status());
    auto copy = co_await loop::Offload(
        context_.pool, [&] { return storage::LocalBlobCopy::Open(context_.blobs, key, context_.spool_dir); });
    if (!copy.ok()) co_return ErrorForWorker(copy.status());
    CountBytes(key, copy->size_bytes(), &JobRunner::AddBytesDown);
    co_return DownloadResponse(std::move(*copy), key);
  }

  // Only round updates are uploaded here: a key without its job's size cap is refused.
  Awaitable<Response> Put(Request& req) {
    const std::string key = req.params["key"];
    StatusOr<std::optional<int64_t>> worker = Verify(req, "PUT", key);
    if (!worker.ok()) co_return Response::Error(worker.status());
    req.principal = *worker ? "worker " + std::to_string(**worker) : "signed URL";
    std::optional<uint64_t> cap;
    if (std::optional<int64_t> job = JobOfKey(key)) {
      if (JobRunner* r = service_.FindRunner(*job)) cap = r->UpdateSizeCap(key);
    }
    if (!cap) {
      co_return Response::Error(
          FailedPreconditionError("uploads to " + key + " are closed: its round attempt is over"));
    }
    if (std::optional<uint64_t> length = req.body_stream->content_length(); length && *length > *cap) {
      co_return Response::Error(ResourceExhaustedError("upload of " + std::to_string(*length) + " bytes exceeds the " +
                                                       std::to_string(*cap) + " allowed for " + key));
    }
    if (auto earlier = uploads_in_flight_.find(key); earlier != uploads_in_flight_.end()) {
      // A retry while the server still holds the worker's earlier PUT (its connection half-open, say): the newer one
      // wins. The earlier one's connection is closed, and this one goes on once that upload has ended.
      PARSYN_LOG_INFO("blob upload to {}: a newer PUT supersedes the one in progress", key);
      std::shared_ptr<loop::Signal> ended = earlier->second.ended;
      if (earlier->second.connection != nullptr) earlier->second.connection->Close();
      const auto give_up = std::chrono::steady_clock::now() + kSupersedeWait;
      while (uploads_in_flight_.contains(key) && std::chrono::steady_clock::now() < give_up) {
        co_await ended->Wait(std::chrono::milliseconds(100));
      }
      if (uploads_in_flight_.contains(key)) {
        co_return Response::Error(
            FailedPreconditionError("an upload to " + key + " is still in progress and did not stop; retry shortly"));
      }
    }
    const int64_t uploader = worker->value_or(-1);  // -1: URLs bound to no worker share one budget
    const int max_per_worker = service_.options().max_uploads_per_worker;
    if (max_per_worker > 0 && uploads_per_worker_[uploader] >= max_per_worker) {
      Response busy = Response::Error(ResourceExhaustedError(
          (uploader < 0 ? std::string("unbound URLs have") : "worker " + std::to_string(uploader) + " has") + " " +
          std::to_string(uploads_per_worker_[uploader]) + " uploads in progress, the most allowed at once (" +
          std::to_string(max_per_worker) + "); retry once one has ended"));
      busy.status = 429;
      busy.WithHeader("Retry-After", "5");
      co_return busy;
    }
    InFlight in_flight(*this, key, uploader, req.connection);
    // Updates need not be durable: after a coordinator restart the attempt in flight is failed and retried
    // (JobRunner::Resume), so an update is never read after a crash, and the new global built from them is written
    // durably before its commit.
    // The update's values are checked as its bytes stream in (one pass over them, not a second read at its result).
    std::shared_ptr<weights::SafetensorsStreamChecker> checker;
    if (JobRunner* r = service_.FindRunner(*JobOfKey(key))) checker = r->NewUploadChecker(key);
    storage::PutOptions put_options{.max_size_bytes = *cap, .expected_sha256 = std::nullopt, .durable = false};
    put_options.size_hint = req.body_stream->content_length();
    if (checker) {
      put_options.observe_chunk = [checker](std::span<const std::byte> chunk) {
        checker->Update(chunk);  // its verdict is read below; the upload itself is never refused here
        return Status::Ok();
      };
    }
    auto upload = StreamBodyToBlob(context_, *req.body_stream, key, put_options);  // kCoAwaitTemporaries
    StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
    if (!stored.ok()) co_return ErrorForWorker(stored.status());
    // Only a passing verdict on exactly the stored bytes is remembered; anything else is checked at the result.
    if (checker && checker->bytes_seen() == stored->size_bytes && checker->Finish().ok()) {
      if (JobRunner* r = service_.FindRunner(*JobOfKey(key))) {
        r->RememberCheckedUpload(key, {.sha256 = stored->sha256, .max_magnitude = checker->max_magnitude()});
      }
    }
    CountBytes(key, stored->size_bytes, &JobRunner::AddBytesUp);
    co_return Response::Json(201, {{"blob_key", key}, {"size_bytes", stored->size_bytes}, {"sha256", stored->sha256}});
  }

 private:
  // An upload streaming now: its connection (to close when a newer PUT to its key supersedes it), and the signal
  // notified when it ends.
  struct ActiveUpload {
    http::ClientConnection* connection = nullptr;
    std::shared_ptr<loop::Signal> ended;
  };
  // How long a superseding PUT waits for the upload it supersedes to end (its reader sees the closed connection).
  static constexpr std::chrono::seconds kSupersedeWait{10};

  // Registers an upload in flight (per key and per worker) for as long as it lives.
  class InFlight {
   public:
    InFlight(BlobRoutes& routes, std::string key, int64_t worker, http::ClientConnection* connection)
        : routes_(routes), key_(std::move(key)), worker_(worker) {
      routes_.uploads_in_flight_[key_] =
          ActiveUpload{.connection = connection, .ended = std::make_shared<loop::Signal>(routes_.service_.executor())};
      ++routes_.uploads_per_worker_[worker_];
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    ~InFlight() {
      if (auto it = routes_.uploads_in_flight_.find(key_); it != routes_.uploads_in_flight_.end()) {
        it->second.ended->Notify();
        routes_.uploads_in_flight_.erase(it);
      }
      if (--routes_.uploads_per_worker_[worker_] <= 0) routes_.uploads_per_worker_.erase(worker_);
    }

   private:
    BlobRoutes& routes_;
    std::string key_;
    int64_t worker_;
  };

  // The worker the URL was issued to (nullopt: bound to none) when the request carries a valid, unexpired signature
  // of `method` on `key` and that worker is not revoked.
  StatusOr<std::optional<int64_t>> Verify(const Request& req, std::string_view method, const std::string& key) const {
    PARSYN_RETURN_IF_ERROR(storage::ValidateBlobKey(key));
    auto expires = req.query.find("expires");
    auto signature = req.query.find("signature");
    auto worker = req.query.find("worker");
    std::optional<int64_t> worker_id;
    if (worker != req.query.end()) {
      int64_t id = 0;
      const std::string& text = worker->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        return UnauthenticatedError("signed URL has a malformed 'worker' value");
      }
      worker_id = id;
    }
    PARSYN_RETURN_IF_ERROR(http::VerifySignedUrl(
        signing_secret_, method, worker_id ? WorkerBoundKey(key, *worker_id) : key,
        expires == req.query.end() ? "" : expires->second, signature == req.query.end() ? "" : signature->second,
        context_.clock.UnixMillis() / 1000));
    // Checked after the signature, so only the holder of a real URL learns the worker's state.
    if (worker_id && service_.WorkerRevoked(*worker_id)) {
      return PermissionDeniedError("this URL was issued to worker " + std::to_string(*worker_id) +
                                   ", which has been revoked");
    }
    // Mutual TLS: a bound URL only for its worker's certificate; an unbound one for any verified certificate.
    if (service_.options().require_worker_certificates) {
      if (worker_id) PARSYN_RETURN_IF_ERROR(CheckWorkerCertificate(req.client_identity, *worker_id));
      if (!worker_id && !req.client_identity) {
        return UnauthenticatedError("this coordinator requires a client certificate (mutual TLS) for /blobs");
      }
    }
    return worker_id;
  }

  // A job's blob traffic counts towards its round's bytes down (`add` JobRunner::AddBytesDown) or up (AddBytesUp).
  void CountBytes(std::string_view key, uint64_t bytes, void (JobRunner::*add)(uint64_t)) {
    if (std::optional<int64_t> job = JobOfKey(key)) {
      if (JobRunner* r = service_.FindRunner(*job)) (r->*add)(bytes);
    }
  }

  const RouteContext context_;
  Service& service_;
  const std::string signing_secret_;
  std::map<std::string, ActiveUpload, std::less<>> uploads_in_flight_;  // the PUTs streaming now, by key
  std::map<int64_t, int> uploads_per_worker_;  // worker id (-1: unbound URLs) -> PUTs streaming now
};

}  // namespace

Status AddBlobRoutes(RouteTable& routes, const RouteContext& context, Service& service, std::string signing_secret) {
  auto h = std::make_shared<BlobRoutes>(context, service, std::move(signing_secret));
  PARSYN_RETURN_IF_ERROR(routes.SignedUrl(Method::kGet, "/blobs/{key...}", Bind(h, &BlobRoutes::Get)));
  const ServiceOptions& options = service.options();
  return routes.SignedUrl(Method::kPut, "/blobs/{key...}", Bind(h, &BlobRoutes::Put),
                          http::RouteOptions{.stream_body = true,
                                             .max_body_bytes = context.max_upload_bytes,
                                             .min_body_rate = {.bytes_per_second = options.upload_min_rate,
                                                               .window = options.upload_rate_window,
                                                               .grace = options.upload_rate_grace}});
}

}  // namespace parsyn::coordinator
