// Internal to the coordinator: how Service registers its routes (open, admin-key, worker-token) and records them
// for the OpenAPI check. Loop thread only.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "coordinator/service.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {

// Sends a blob's local copy as the body; a temporary copy (S3) is removed once the response has been written.
inline http::Response FileResponse(storage::LocalBlobCopy copy, std::string content_type = "application/octet-stream") {
  http::Response res = http::Response::File(copy.path(), std::move(content_type));
  res.file_owner = std::make_shared<const storage::LocalBlobCopy>(std::move(copy));
  return res;
}

using WorkerHandler = std::function<http::Awaitable<http::Response>(http::Request&, int64_t worker_id)>;

class Service::Routes {
 public:
  Routes(Service& service, http::Router& router, std::vector<RouteInfo>& table)
      : service_(service), router_(router), table_(table) {}

  // No credentials (/healthz; /blobs, which check their own signature).
  Status Open(http::Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options = {});
  // Needs "Authorization: Bearer <admin key>".
  Status Admin(http::Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options = {});
  // Needs "Authorization: Bearer <worker token>"; the handler gets the worker's id from the token.
  Status Worker(http::Method method, std::string_view pattern, WorkerHandler handler, http::RouteOptions options = {});

 private:
  Service& service_;
  http::Router& router_;
  std::vector<RouteInfo>& table_;
};

}  // namespace parsyn::coordinator
