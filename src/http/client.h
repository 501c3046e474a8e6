// A blocking HTTP client for the worker agent and the CLI, on the libcurl transport (net/transport.h).
//
// Threads: a Client may be shared by several threads; each call uses its own curl handle (handles and their
// connections are pooled and reused between calls). Calls block the calling thread; never use it on the server's
// event loop.
// Errors: every transport failure and every non-2xx answer comes back as a Status whose message names the method,
// the URL and the reason: "GET http://127.0.0.1:8080/api/v1/jobs: connection refused (is `parsyn server` running?)".
// Non-2xx answers carry the code from the API's {"error": {"code", "message"}} body (or one derived from the HTTP
// status: 409 and 412 are FailedPrecondition); connection failures are Unavailable, timeouts DeadlineExceeded, a stop
// request Cancelled.
// Proxies come from the environment (http_proxy, https_proxy, no_proxy), as libcurl reads them by default.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "http/types.h"

namespace parsyn::net {
class Transport;
class RequestBody;
class ResponseSink;
}  // namespace parsyn::net

namespace parsyn::http {

struct ClientOptions {
  std::string base_url;      // "http://127.0.0.1:8080"; call paths starting with '/' are appended to it
  std::string bearer_token;  // sent as "Authorization: Bearer <token>" when set
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds timeout{60'000};        // per attempt, for calls with in-memory bodies (0: none)
  std::chrono::milliseconds stall_timeout{60'000};  // any transfer that moves no byte for this long fails
  // Retries of idempotent calls (GET, PUT, DELETE) on connection errors, timeouts and 502/503/504, with capped
  // exponential backoff (each wait drawn from [b/2, b], b doubling from backoff_initial up to backoff_max).
  int max_attempts = 4;
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{5'000};
  std::filesystem::path ca_file;           // extra trusted CAs, besides the system's (a coordinator's private CA)
  std::filesystem::path client_cert_file;  // client certificate (PEM) for servers that ask for one (mutual TLS)
  std::filesystem::path client_key_file;   // its private key (PEM)
  uint64_t max_response_bytes = 64 << 20;  // in-memory response bodies larger than this fail (ResourceExhausted)
  std::string unreachable_hint;            // appended to connection failures, e.g. "is `parsyn server` running?"
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every call (before each call's own)
};

struct CallOptions {
  std::optional<bool> retry{};                         // default: yes for GET/PUT/DELETE/HEAD, no for POST/PATCH
  std::optional<std::chrono::milliseconds> timeout{};  // replaces ClientOptions::timeout (e.g. a long-poll)
  std::vector<std::pair<std::string, std::string>> headers{};
  std::stop_token stop{};  // a stop request aborts the call (within about a second) with Cancelled
  // UploadFile/UploadFileRange/DownloadToFile: called on the calling thread as the body moves, with the bytes sent or
  // received so far in this attempt (a retry starts again from 0); for progress bars.
  std::function<void(uint64_t bytes)> on_transfer{};
};

struct ClientResponse {
  int status = 0;
  std::string body;
  StringMap headers;  // names lower-cased
  // Parses `body`; InvalidArgument when it is not JSON.
  StatusOr<nlohmann::json> Json() const;
};

struct SseEvent {
  std::string event = "message";  // the SSE default when the frame has no "event:" line
  std::string data;               // "data:" lines joined with '\n'
  std::string id;
};

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  StatusOr<ClientResponse> Get(std::string_view path, CallOptions call = {});
  StatusOr<ClientResponse> Delete(std::string_view path, CallOptions call = {});
  StatusOr<ClientResponse> PostJson(std::string_view path, const nlohmann::json& body, CallOptions call = {});
  StatusOr<ClientResponse> PutJson(std::string_view path, const nlohmann::json& body, CallOptions call = {});
  // Any method with an in-memory body (empty `content_type`: no Content-Type header).
  StatusOr<ClientResponse> Send(Method method, std::string_view path, std::string body, std::string content_type,
                                CallOptions call = {});

  // Sends `file` as the body, read in chunks (never whole in memory). NotFound when the file cannot be opened.
  StatusOr<ClientResponse> UploadFile(Method method, std::string_view path, const std::filesystem::path& file,
                                      std::string content_type = "application/octet-stream", CallOptions call = {});
  // Sends bytes [offset, offset + length) of `file` as the body, streamed like UploadFile (an S3 multipart part).
  // Each attempt reopens the file and starts again at `offset`. NotFound when the file cannot be opened;
  // InvalidArgument when the range reaches past the file's end.
  StatusOr<ClientResponse> UploadFileRange(Method method, std::string_view path, const std::filesystem::path& file,
                                           uint64_t offset, uint64_t length,
                                           std::string content_type = "application/octet-stream",
                                           CallOptions call = {});
  // GETs `path` into `dest`: written to "<dest>.part", then renamed, so `dest` is whole or absent. Returns the
  // number of bytes. No total timeout unless `call.timeout` is set (stall_timeout still applies).
  StatusOr<uint64_t> DownloadToFile(std::string_view path, const std::filesystem::path& dest, CallOptions call = {});
  // GETs an SSE stream and calls `on_event` for each event, in order, on the calling thread. Returns OK when the
  // server ends the stream or `on_event` returns false; Cancelled on a stop request. No retries: the caller decides
  // whether to reconnect.
  Status ReadEvents(std::string_view path, const std::function<bool(const SseEvent&)>& on_event, CallOptions call = {});

 private:
  std::string Url(std::string_view path) const;
  // One call through the transport: `body` (may be null) is sent, a 2xx body goes to `sink` (null: memory).
  // `streaming` calls have no total timeout unless the call sets one.
  StatusOr<ClientResponse> Execute(Method method, std::string_view path, const CallOptions& call,
                                   net::RequestBody* body, std::string_view content_type, net::ResponseSink* sink,
                                   bool streaming);

  ClientOptions options_;
  std::unique_ptr<net::Transport> transport_;
};

}  // namespace parsyn::http
