// /blobs/{key...}: GET or PUT one blob with a signed URL (http/signed_url.h), the only credential workers use for
// weights and data. PUT is create-only and capped at the size the key's job allows.
#include <charconv>

#include "coordinator/api_json.h"
#include "coordinator/job_runner.h"
#include "coordinator/loop_tools.h"
#include "coordinator/service_routes.h"
#include "http/signed_url.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;
using nlohmann::json;

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

}  // namespace

Status Service::AddBlobRoutes(Routes& routes) {
  Service* self = this;
  auto verify = [self](const Request& req, std::string_view method, const std::string& key) -> Status {
    PARSYN_RETURN_IF_ERROR(storage::ValidateBlobKey(key));
    auto expires = req.query.find("expires");
    auto signature = req.query.find("signature");
    return http::VerifySignedUrl(self->signing_secret_, method, key, expires == req.query.end() ? "" : expires->second,
                                 signature == req.query.end() ? "" : signature->second,
                                 self->clock().UnixMillis() / 1000);
  };

  PARSYN_RETURN_IF_ERROR(
      routes.Open(Method::kGet, "/blobs/{key...}", [self, verify](Request& req) -> Awaitable<Response> {
        const std::string key = req.params["key"];
        Status allowed = verify(req, "GET", key);
        if (!allowed.ok()) co_return Response::Error(allowed);
        auto copy = co_await Offload(
            self->pool(), [&] { return storage::LocalBlobCopy::Open(self->blobs(), key, self->spool_dir()); });
        if (!copy.ok()) co_return Response::Error(copy.status());
        if (std::optional<int64_t> job = JobOfKey(key)) {
          if (JobRunner* r = self->FindRunner(*job)) r->AddBytesMoved(copy->size_bytes());
        }
        co_return FileResponse(std::move(*copy));
      }));

  PARSYN_RETURN_IF_ERROR(routes.Open(
      Method::kPut, "/blobs/{key...}",
      [self, verify](Request& req) -> Awaitable<Response> {
        const std::string key = req.params["key"];
        Status allowed = verify(req, "PUT", key);
        if (!allowed.ok()) co_return Response::Error(allowed);
        std::optional<uint64_t> cap;
        if (std::optional<int64_t> job = JobOfKey(key)) {
          if (JobRunner* r = self->FindRunner(*job)) cap = r->UpdateSizeCap(key);
        }
        if (!cap) {
          co_return Response::Error(
              FailedPreconditionError("uploads to " + key + " are closed: its round attempt is over"));
        }
        if (std::optional<uint64_t> length = req.body_stream->content_length(); length && *length > *cap) {
          co_return Response::Error(ResourceExhaustedError("upload of " + std::to_string(*length) +
                                                           " bytes exceeds the " + std::to_string(*cap) +
                                                           " allowed for " + key));
        }
        storage::BlobStore& blobs = self->blobs();
        // Only round updates are uploaded here (a key without a cap was refused above). They need not be durable:
        // after a coordinator restart the attempt in flight is failed and retried (JobRunner::Resume), so an update
        // is never read after a crash, and the new global built from them is written durably before its commit.
        const storage::PutOptions put_options{
            .max_size_bytes = *cap, .expected_sha256 = std::nullopt, .durable = false};
        auto upload = StreamBodyInto<StatusOr<storage::BlobInfo>>(
            self->upload_pool(), *req.body_stream,
            [&blobs, key, put_options](storage::ByteSource& body) { return blobs.Put(key, body, put_options); });
        StatusOr<storage::BlobInfo> stored = co_await std::move(upload);
        if (!stored.ok()) co_return Response::Error(stored.status());
        if (std::optional<int64_t> job = JobOfKey(key)) {
          if (JobRunner* r = self->FindRunner(*job)) r->AddBytesMoved(stored->size_bytes);
        }
        co_return Response::Json(201,
                                 {{"blob_key", key}, {"size_bytes", stored->size_bytes}, {"sha256", stored->sha256}});
      },
      http::RouteOptions{.stream_body = true, .max_body_bytes = options_.max_upload_bytes}));
  return Status::Ok();
}

}  // namespace parsyn::coordinator
