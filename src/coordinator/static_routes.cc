#include "coordinator/static_routes.h"

#include <string>

#include "web/web_assets.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Request;
using http::Response;

namespace {

// Scripts and styles come only from this server; inline style attributes are allowed (progress bars, uPlot).
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

Response AssetResponse(const web::WebAsset& asset) {
  // no-cache: the browser revalidates, so a new binary's files are picked up at once (they are small).
  return Response::Text(200, std::string(asset.bytes), std::string(asset.content_type))
      .WithHeader("Cache-Control", "no-cache")
      .WithHeader("X-Content-Type-Options", "nosniff")
      .WithHeader("Content-Security-Policy", kContentSecurityPolicy);
}

}  // namespace

Status AddStaticRoutes(http::Router& router) {
  PARSYN_RETURN_IF_ERROR(router.Add(http::Method::kGet, "/", [](Request&) -> Awaitable<Response> {
    const web::WebAsset* index = web::FindWebAsset("index.html");
    if (index == nullptr) co_return Response::Error(NotFoundError("this build has no dashboard"));
    co_return AssetResponse(*index);
  }));
  return router.Add(http::Method::kGet, "/ui/{path...}", [](Request& req) -> Awaitable<Response> {
    const std::string& path = req.params["path"];
    const web::WebAsset* asset = web::FindWebAsset(path);
    if (asset == nullptr) co_return Response::Error(NotFoundError("no dashboard file '" + path.substr(0, 200) + "'"));
    co_return AssetResponse(*asset);
  });
}

}  // namespace parsyn::coordinator
