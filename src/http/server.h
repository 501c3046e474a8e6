// An HTTP/1.1 server (Boost.Beast + Asio C++20 coroutines) with a router, JSON and streamed bodies, Server-Sent
// Events, per-connection timeouts, keep-alive, graceful shutdown and optional TLS.
//
// Threads: the server runs on the io_context the caller passes in, which must be run by exactly ONE thread. Handlers
// are coroutines on that thread, so they may touch the caller's event-loop state without locks, and must never block
// it (wait with a loop::Signal, not sleep). Handlers never throw; an escaping exception becomes a 500 and is logged.
// Beast stays out of this header: handlers see only Request, Response, BodyReader and EventStream.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "http/types.h"
#include "loop/signal.h"

namespace parsyn::http {

using loop::Awaitable;  // loop/signal.h

// A request body read by a blocking reader on another thread (BodyReader::TakeDirect): each Read() receives straight
// from the socket into the caller's buffer, so a large upload is neither parsed nor copied on the event loop, and
// several uploads are received by several threads at once. Errors as BodyReader::Next(), with the same limits (the
// route's size cap, ServerOptions::body_timeout, RouteOptions::min_body_rate).
class DirectBody {
 public:
  virtual ~DirectBody() = default;
  // Blocks until some bytes arrive: up to out.size() of them; 0 once the body is complete. One thread at a time.
  virtual StatusOr<size_t> Read(std::span<char> out) = 0;
};

// A request body read chunk by chunk (routes added with RouteOptions::stream_body), so a multi-GB blob never sits in
// memory. Valid only while the handler runs. Errors from Next(): ResourceExhausted past the route's size cap,
// DeadlineExceeded when the client stalls longer than ServerOptions::body_timeout (the connection is already closed
// then; return any error), Unavailable when the client went away, InvalidArgument on broken framing. A handler that
// returns before the body is complete gets its response sent, and then the connection is closed.
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // The next chunk (a view into a server buffer, valid until the next call); empty once the body is complete.
  virtual Awaitable<StatusOr<std::string_view>> Next() = 0;
  // The Content-Length header, when the client sent one (chunked uploads have none).
  virtual std::optional<uint64_t> content_length() const = 0;
  // The rest of the body for a blocking reader on another thread, when it can be received straight from the socket
  // (plain TCP, a Content-Length body, Next() not called yet); nullptr otherwise (TLS, chunked): use Next(). Call on
  // the loop. Until the handler returns, the handler must not call Next(), and must have stopped calling Read() (it
  // waits for its reader thread) before it returns.
  virtual std::shared_ptr<DirectBody> TakeDirect() { return nullptr; }
};

// The client's connection as a handler that waits (a long-poll) sees it: whether the client has gone away. The server
// otherwise learns of a closed connection only when it writes the answer.
class ClientConnection {
 public:
  virtual ~ClientConnection() = default;
  // Starts watching for the client closing the connection (end of stream or reset: a killed client's kernel closes its
  // socket) and returns the signal notified then (also when the server closes the connection). The watch is one wait
  // for readability on the socket (no thread, no timer), and ends when the handler returns. Bytes the client sends
  // meanwhile (a pipelined request; over TLS, also a close_notify sent before closing) end the watch unread: the
  // client is there. A client that shuts down only its sending side counts as gone. Only a request whose body was read
  // whole is watched (never one whose body is still arriving or read by a DirectBody: the signal then fires only when
  // the server closes the connection). On the loop.
  virtual loop::Signal& WatchForClientClose() = 0;
  // True once the watch saw the client close the connection.
  virtual bool client_gone() const = 0;
  // Closes the connection now: a body still arriving ends in an error (a DirectBody reader sees the end), and the
  // handler's answer goes nowhere. For a request that a newer one supersedes. On the loop.
  virtual void Close() = 0;
};

struct Request {
  Method method = Method::kGet;
  std::string target;     // as sent: "/api/v1/training-jobs?limit=5"
  std::string path;       // percent-decoded path: "/api/v1/training-jobs"
  std::string route;      // the matched route's pattern: "/api/v1/training-jobs/{id}"; "" when none
  std::string principal;  // who the route's credential check found ("admin", "worker 7"), for logs
  // What the route's check found the request acts within (the coordinator's project: its id and name), for the
  // audit log; 0 and "" when nothing.
  int64_t scope_id = 0;
  std::string scope;
  StringMap params;                   // path parameters: {"id": "17"} for "/api/v1/training-jobs/{id}"
  StringMap query;                    // decoded query parameters (the last one wins when a name repeats)
  StringMap headers;                  // names lower-cased
  std::string body;                   // the whole body, for routes that do not stream it
  BodyReader* body_stream = nullptr;  // the body, for routes with stream_body; null otherwise
  std::string remote_address;         // "127.0.0.1:53122"
  // Names the request in logs and the audit log, and comes back in the response's X-Request-Id: the client's own
  // X-Request-Id when it is 1 to 64 of [A-Za-z0-9._:-], else 16 hex digits made here.
  std::string request_id;
  // With ServerOptions::tls_client_ca: who the client's certificate names, when the client sent one that verified
  // against those CAs (its subject CN, else its first DNS subjectAltName; one that does not verify fails the
  // handshake). Unset otherwise (no certificate, plain HTTP): the server serves clients without a certificate, and
  // routes that need one refuse the request themselves.
  std::optional<std::string> client_identity;
  // Set by the server: a long-poll watches it for the client leaving (ClientConnection).
  ClientConnection* connection = nullptr;

  // A header's value by case-insensitive name, or "" when absent.
  std::string_view Header(std::string_view name) const;
  // The value of the cookie `name` in the Cookie header; nullopt when it has none.
  std::optional<std::string> Cookie(std::string_view name) const;
  // Parses `body` as JSON. InvalidArgument (with the parser's position) when it is not valid JSON.
  StatusOr<nlohmann::json> JsonBody() const;
};

// The sending side of a Server-Sent Events response. Send() and Comment() return false once the client has left or
// the server is stopping; the producer should then return.
class EventStream {
 public:
  virtual ~EventStream() = default;
  // Writes one frame: "id: ...\nevent: ...\ndata: ...\n\n" (multi-line data becomes several data: lines;
  // empty `event`/`id` are left out).
  virtual Awaitable<bool> Send(std::string_view event, std::string_view data, std::string_view id = {}) = 0;
  // Several frames in one write (a page of a job's stored events: 20,000 a round at 10,000 workers), each as Send
  // writes it.
  struct Frame {
    std::string event;
    std::string data;
    std::string id;
  };
  virtual Awaitable<bool> SendAll(std::span<const Frame> frames) = 0;
  // Writes ": text\n\n", which clients ignore.
  virtual Awaitable<bool> Comment(std::string_view text) = 0;
  // Waits until `signal` is notified (true) or the stream closes (false: client gone, server stopping), writing a
  // keep-alive comment every ServerOptions::sse_keepalive meanwhile.
  virtual Awaitable<bool> Wait(loop::Signal& signal) = 0;
  virtual bool open() const = 0;
};

struct Response {
  using EventProducer = std::function<Awaitable<void>(EventStream&)>;

  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;
  std::filesystem::path file;              // when set, the body is this file, sent in chunks
  std::shared_ptr<const void> file_owner;  // held until the response is written (e.g. a temporary copy of a blob)
  EventProducer event_producer;            // when set, the response is an SSE stream driven by this coroutine

  static Response Json(int status, const nlohmann::json& body);
  static Response Text(int status, std::string text, std::string content_type = "text/plain; charset=utf-8");
  static Response NoContent();
  // {"error": {"code": StatusCodeSlug(code), "message": message}} with HttpStatusFor(code). `status` must not be OK.
  static Response Error(const Status& status);
  // Streams the file. If it cannot be opened when the response is written, the client gets a 404 error instead.
  static Response File(std::filesystem::path path, std::string content_type = "application/octet-stream");
  // An SSE response ("text/event-stream"); `producer` runs on the loop until it returns or the stream closes.
  static Response Events(EventProducer producer);

  Response& WithHeader(std::string name, std::string value);
};

using Handler = std::function<Awaitable<Response>(Request&)>;

// The slowest a streamed body may arrive (RouteOptions::min_body_rate). The clock starts at the handler's first
// BodyReader::Next() and stops while the handler is not reading (time spent waiting for the handler does not count
// against the client). After `grace`, every `window` must bring at least bytes_per_second * window bytes; a slower
// body is cut: Next() fails with DeadlineExceeded ("... below the minimum of ..."), the handler's answer is sent, and
// the connection is closed.
struct BodyRate {
  uint64_t bytes_per_second = 0;  // 0: no minimum
  std::chrono::milliseconds window{30'000};
  std::chrono::milliseconds grace{10'000};
};

// A check of a request's credentials from its header alone (method, path, params, query, headers), run after
// routing and before any of the body is read: a non-OK status is answered at once (Response::Error) and the body is
// never read, so unauthenticated clients cannot make the server buffer or wait for a body.
using Authorizer = std::function<Status(const Request&)>;

struct RouteOptions {
  bool stream_body = false;     // hand the handler a BodyReader instead of reading the body into Request::body
  uint64_t max_body_bytes = 0;  // 0: ServerOptions::max_body_bytes. Larger bodies get 413 resource_exhausted.
  BodyRate min_body_rate{};     // streamed bodies only (stream_body)
  Authorizer authorize{};       // when set, runs before the body is read (and before 413 and 100-continue)
};

// Maps (method, path) to handlers. Patterns are literal segments, "{name}" (one segment) and, last only,
// "{name...}" (the rest of the path, slashes included: "/blobs/{key...}"). When several patterns match, the one with
// more literal segments wins. A path that matches only under other methods gets 405 with an Allow header.
// Not thread-safe; build it before Server::Start.
class Router {
 public:
  // Adds a route. InvalidArgument for a malformed pattern; AlreadyExists for a duplicate (method, pattern).
  Status Add(Method method, std::string_view pattern, Handler handler, RouteOptions options = {});

  struct Route {
    Method method;
    std::vector<std::string> segments;
    Handler handler;
    RouteOptions options;
    int literal_count = 0;
    std::string pattern;  // as added: "/api/v1/training-jobs/{id}"
  };
  struct Match {
    const Route* route = nullptr;  // null when nothing matched
    StringMap params;
    std::vector<Method> allowed;  // when route is null: the methods the path exists under (empty: 404)
  };
  // `path` is the raw (still percent-encoded) path; parameters come back decoded. InvalidArgument on bad escapes.
  StatusOr<Match> Find(Method method, std::string_view path) const;

 private:
  std::vector<Route> routes_;
};

// What the server tells ServerOptions::on_request about each answered request (for access logs and metrics). No
// query string, header or body: they may carry credentials and signatures.
struct RequestRecord {
  const Request& request;  // method, path, route ("" when no route matched), remote_address
  int status = 0;
  std::chrono::steady_clock::duration duration{};  // from the end of the header to the response being ready
  uint64_t bytes_received = 0;                     // request body bytes read
  uint64_t bytes_sent = 0;                         // response body bytes (0 for event streams)
};

struct ServerOptions {
  std::string listen = "127.0.0.1:0";   // "host:port", "[::1]:port"; port 0 picks a free one (see Server::port())
  std::filesystem::path tls_cert_file;  // PEM chain; with tls_key_file set, the server speaks only HTTPS
  std::filesystem::path tls_key_file;   // PEM private key
  std::filesystem::path tls_client_ca;  // PEM CAs: ask for and verify client certificates (Request::client_identity)
  uint64_t max_body_bytes = 1 << 20;    // default cap for buffered bodies
  uint32_t max_header_bytes = 16 << 10;
  // header_timeout counts from the connection's start or the end of the previous response: it bounds keep-alive
  // idleness and a header trickled byte by byte alike (no byte received extends it).
  std::chrono::milliseconds header_timeout{30'000};  // a deadline for the whole request header
  std::chrono::milliseconds body_timeout{60'000};    // the longest gap while receiving a body
  // The whole of a buffered body (a route without stream_body: JSON, at most max_body_bytes or the route's cap) must
  // arrive within this, however it trickles; past it the request gets deadline_exceeded (504, as a stalled body does)
  // and the connection closes.
  std::chrono::milliseconds buffered_body_deadline{120'000};
  std::chrono::milliseconds write_timeout{60'000};  // the longest gap while sending a response
  std::chrono::milliseconds sse_keepalive{15'000};  // comment interval on idle event streams
  // Connection caps. A connection beyond max_connections open at once is answered 503 unavailable, one beyond
  // max_connections_per_address from one peer IP address 429 resource_exhausted; both with Retry-After:
  // overload_retry_after and a JSON error body, then closed. Accepting never stops; refusals in progress are bounded
  // too (past that, excess connections are closed without an answer). 0: no cap.
  uint32_t max_connections = 4096;
  uint32_t max_connections_per_address = 256;
  std::chrono::seconds overload_retry_after{5};
  // Called on the server's thread once each request is answered (before the response is written); must not block.
  // Unset: each request is logged at debug level.
  std::function<void(const RequestRecord&)> on_request;
};

// Accepts that failed for want of file descriptors (EMFILE, ENFILE): each such connection is refused with a 503 (or
// waits in the listen queue), and the server logs what to do once a minute.
struct AcceptFailures {
  uint64_t fd_exhausted = 0;
  int64_t last_fd_exhausted_unix_ms = 0;  // 0: never
};

// Whether `listen` ("host:port", as ServerOptions::listen) names a loopback address: 127.0.0.0/8, ::1 or localhost.
// An empty host, 0.0.0.0 and :: (every interface) are not. InvalidArgument for a malformed address.
StatusOr<bool> IsLoopbackListenAddress(std::string_view listen);

class Server {
 public:
  // Binds, listens and starts accepting on `io`. Call before io.run() or from the io thread.
  // Errors: InvalidArgument for a bad address, unreadable/invalid TLS files, or a client CA without TLS; Unavailable
  // when binding fails.
  static StatusOr<std::unique_ptr<Server>> Start(boost::asio::io_context& io, ServerOptions options, Router router);
  // Closes every socket at once (prefer Shutdown). Do not destroy the server while a handler of it is running.
  ~Server();

  uint16_t port() const;  // the bound port
  bool tls() const;
  bool verifies_client_certificates() const;  // ServerOptions::tls_client_ca was given
  bool stopping() const;
  AcceptFailures accept_failures() const;  // on the loop's thread

  // Graceful shutdown: stops accepting, closes idle keep-alive connections and event streams, lets in-flight
  // requests finish until `grace` has passed, then closes what is left. Completes when every connection is gone.
  Awaitable<void> Shutdown(std::chrono::milliseconds grace);
  // Notified when Shutdown begins, so long-poll handlers can return early:
  //   std::array<loop::Signal*, 2> wake{&work, &server.stopping_signal()};  co_await loop::WaitAny(wake, timeout);
  loop::Signal& stopping_signal();

  struct State;

 private:
  explicit Server(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace parsyn::http
