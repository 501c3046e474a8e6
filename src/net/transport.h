// The one libcurl transport: every outgoing HTTP request of the platform (src/http's Client, src/storage's S3 store)
// goes through a Transport, which owns easy-handle setup and pooling, timeouts, request bodies streamed from memory
// or files, responses kept in memory or handed to a sink (or pulled by the caller), retries with capped exponential
// backoff on transient failures, and error messages that never show a URL's query (signed and presigned URLs carry
// their credential there).
//
// Threads: a Transport may be shared by several threads; each call uses its own curl handle (idle handles and their
// connections are pooled). Calls block the calling thread. A ResponseStream is used by one thread at a time and may
// outlive its Transport.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace parsyn::net {

using Headers = std::vector<std::pair<std::string, std::string>>;   // sent in order; an empty value removes a header
using HeaderMap = std::map<std::string, std::string, std::less<>>;  // names lower-cased

// "https://host/a/b?X-Amz-Signature=…" -> "https://host/a/b?…": how URLs appear in messages and logs.
std::string WithoutQuery(std::string_view url);

// Where a request's body comes from. Each attempt reads it again from its first byte.
class RequestBody {
 public:
  virtual ~RequestBody() = default;
  // Prepares to read from the first byte; called before each attempt, before size(). Its error ends the call.
  virtual Status Rewind() = 0;
  virtual uint64_t size() const = 0;
  // Copies up to `n` next bytes into `out`. An error ends the call with that error; 0 before size() bytes aborts
  // the transfer (a file that shrank under us) with libcurl's message.
  virtual StatusOr<size_t> Read(char* out, size_t n) = 0;
};

// `bytes` (which must outlive the call) as a body.
std::unique_ptr<RequestBody> MemoryBody(std::string_view bytes);
// Bytes [offset, offset + length) of `file` (no length: to its end), reopened on each attempt and never whole in
// memory. Rewind fails NotFound when the file cannot be opened, InvalidArgument when the range reaches past its end.
std::unique_ptr<RequestBody> FileBody(std::filesystem::path file, uint64_t offset = 0,
                                      std::optional<uint64_t> length = std::nullopt);

// Where the body of a 2xx response goes when it is not kept in memory (a file, an event parser).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Called before each attempt (a retry starts the body again). Its error ends the call.
  virtual Status Begin() { return Status::Ok(); }
  // The body's bytes in order. false ends the transfer at once: the call returns the response with
  // `stopped_by_sink` (the sink knows why it stopped).
  virtual bool Write(std::string_view bytes) = 0;
};

struct Request {
  std::string method = "GET";
  std::string url;
  Headers headers{};
  RequestBody* body = nullptr;                   // none: a POST sends an empty form body
  ResponseSink* sink = nullptr;                  // none: a 2xx body is kept in Response::body, up to max_body_bytes
  uint64_t max_body_bytes = uint64_t{64} << 20;  // a larger in-memory 2xx body fails with ResourceExhausted
  std::chrono::milliseconds timeout{0};          // total time per attempt (0: none; the stall timeout still applies)
  bool retry = false;                            // retry transient failures (TransportOptions::max_attempts)
  std::stop_token stop{};  // a stop request aborts the call (within about a second) with Cancelled
  std::string what{};      // names the request in messages; default "METHOD URL" without the query
};

struct Response {
  int status = 0;
  HeaderMap headers;  // of the final response (after 100 Continue or redirects)
  std::string body;   // a 2xx body without a sink; the head of any other body (max_error_body_bytes)
  bool stopped_by_sink = false;
  // The call was retried and its last attempt failed in a retryable way (a 502/503/504 answer): callers say
  // "after N attempts" when they turn the answer into an error.
  int attempts = 1;
  bool retries_exhausted = false;
};

// Why a transfer ended without a complete response.
struct TransferFailure {
  enum class Kind { kRefused, kCannotConnect, kCannotResolve, kTimedOut, kStalled, kOther };
  Kind kind = Kind::kOther;
  std::string reason;  // libcurl's words ("Failed to connect to 127.0.0.1 port 9 after 0 ms: Couldn't connect...")
};

struct TransportOptions {
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds stall_timeout{60'000};  // a transfer that moves no byte for this long fails (0: never)
  // Retries (of requests with Request::retry) on connection errors, timeouts and 502/503/504, with capped exponential
  // backoff (each wait drawn from [b/2, b], b doubling from backoff_initial up to backoff_max).
  int max_attempts = 4;
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{5'000};
  uint64_t max_error_body_bytes = uint64_t{64} << 10;  // the head kept of a non-2xx body; the rest is dropped
  // Extra trusted certificates (PEM), on top of the system's: a coordinator's private CA, or its own certificate
  // (each is a trust anchor, self-signed or not), while S3 and other public endpoints still verify against the
  // system store. Host names are checked as usual.
  std::filesystem::path ca_file;
  // A client certificate (PEM, with its chain) and its private key (PEM, unencrypted), presented when a server asks
  // for one (a coordinator with --client-ca). Both or neither.
  std::filesystem::path client_cert_file;
  std::filesystem::path client_key_file;
  bool path_as_is = false;       // send "./" and "../" in paths as they are (S3 keys may hold them, signed as sent)
  bool http_1_1 = false;         // never negotiate HTTP/2
  bool tcp_keepalive = false;    // TCP keep-alive probes on idle pooled connections
  std::string unreachable_hint;  // appended to connection failures by the default describe_failure
  // How a transport failure reads. Default (DescribeFailure): "<what>: connection refused (<hint>)", "<what>: timed
  // out: <reason>" (DeadlineExceeded), Unavailable otherwise.
  std::function<Status(std::string_view what, const TransferFailure& failure)> describe_failure;
};

// The default describe_failure.
Status DescribeFailure(std::string_view what, const TransferFailure& failure, std::string_view unreachable_hint);

// A response whose 2xx body the caller pulls (Transport::Open). Memory stays bounded: the transfer pauses while
// about 1 MiB waits unread. Fails with the transport's describe_failure, also when the server sends nothing for
// stall_timeout (time the caller spent not reading excluded).
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Status and headers; for a non-2xx answer also its body (read whole, up to max_error_body_bytes).
  virtual const Response& response() const = 0;
  // The next bytes of a 2xx body; 0 at its end.
  virtual StatusOr<size_t> Read(std::span<std::byte> buffer) = 0;
};

class Transport {
 public:
  explicit Transport(TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  const TransportOptions& options() const { return options_; }

  // Runs the request (with retries when it asks for them) and returns the final response, whatever its HTTP
  // status: callers map non-2xx answers to their own errors. Errors: transport failures (describe_failure, with
  // "after N attempts" when retried), Cancelled on a stop request, ResourceExhausted for an in-memory body over
  // max_body_bytes, the body's or sink's own errors.
  StatusOr<Response> Perform(const Request& request);

  // Sends a body-less request (no retries, no sink) and returns once the response headers have arrived.
  StatusOr<std::unique_ptr<ResponseStream>> Open(const Request& request);

 private:
  struct Pool;
  TransportOptions options_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace parsyn::net
