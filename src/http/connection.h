// One client connection of the HTTP server, for either stream (plain TCP or TLS): the Connection template with its
// event stream (its request body reader is in connection_body.h, included at the end), and the refusal of a
// connection beyond the caps. Internal to the layer: only
// connection.cc (plain) and connection_tls.cc (TLS) include it, each compiling the templates for its stream.
#pragma once

#include <utility>  // before Asio: boost/asio/awaitable.hpp uses std::exchange without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

#include "base/log.h"
#include "base/strings.h"
#include "http/body_rate_window.h"
#include "http/direct_socket_body.h"
#include "http/internal.h"
#include "http/server_state.h"

namespace parsyn::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::redirect_error;
using asio::use_awaitable;
using RequestParser = bhttp::request_parser<bhttp::buffer_body>;

inline constexpr size_t kBodyChunkBytes = 64 << 10;
inline constexpr size_t kFileChunkBytes = 256 << 10;
// After an error response to a request whose body was not read, keep reading (and dropping) it for a moment before
// closing: closing with unread bytes makes the kernel send RST, and the client may lose the response.
inline constexpr auto kLingerTime = std::chrono::milliseconds(1000);
inline constexpr uint64_t kLingerBytes = 16 << 20;
// Connections beyond the caps get their 503/429 within kRefusalTime (TLS handshake and write), then are drained for
// at most kLingerTime (server.cc answers at most kMaxRefusals at once).
inline constexpr auto kRefusalTime = std::chrono::milliseconds(2000);
inline constexpr uint64_t kRefusalDrainBytes = 64 << 10;

// Helpers of connection.cc.
std::optional<Method> ToMethod(bhttp::verb verb);
inline std::string_view View(boost::beast::string_view s) { return std::string_view(s.data(), s.size()); }
bool IsHttpParseError(const beast::error_code& ec);
// One server-sent event: `id:`, `event:` and one `data:` line per line of `data`, then a blank line.
std::string FormatEvent(std::string_view event, std::string_view data, std::string_view id);
// Who a verified client certificate names: its subject CN, else its first DNS subjectAltName. Nothing when the client
// sent no certificate, or one that did not verify (the handshake has failed already then, but check anyway).
std::optional<std::string> VerifiedPeerIdentity(SSL* ssl);

// One client connection: reads requests in a loop (keep-alive), dispatches them, writes responses.
// Stream is beast::tcp_stream or beast::ssl_stream<beast::tcp_stream>.
template <class Stream>
class Connection final : public ConnectionBase,
                         public ClientConnection,
                         public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Connection(std::shared_ptr<Server::State> state, Stream stream, std::string remote)
      : state_(std::move(state)),
        opts_(state_->options),
        stream_(std::move(stream)),
        remote_(std::move(remote)),
        closing_(state_->io.get_executor()) {}
  // Normally Run() has unregistered already; this covers a coroutine destroyed with its io_context.
  ~Connection() override { state_->connections.erase(this); }

  static asio::awaitable<void> Run(std::shared_ptr<Connection> self) {
    self->state_->connections.insert(self.get());
    try {
      co_await self->Loop();
    } catch (const std::exception& e) {
      PARSYN_LOG_ERROR("http: connection from {} failed: {}", self->remote_, e.what());
    }
    self->CloseSocket();
    self->state_->connections.erase(self.get());
    self->state_->connections_changed.Notify();
  }

  void CloseIfIdle() override {
    if (idle_) Close();
  }
  void Close() override {
    closed_ = true;
    CloseSocket();
    closing_.Notify();
  }

  loop::Signal& WatchForClientClose() override {
    const bool body_read = request_parser_ != nullptr && request_parser_->is_done() && !direct_reading_;
    if (!client_watched_ && body_read && !closed_ && !peer_gone_) {
      client_watched_ = true;
      asio::co_spawn(stream_.get_executor(), WatchClient(this->shared_from_this(), ++client_watch_generation_),
                     asio::detached);
    }
    return closing_;
  }
  bool client_gone() const override { return peer_gone_; }

 private:
  class Body;
  class Events;

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void CloseSocket() {
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ec);  // also wakes a DirectBody reader: it sees the end
    if (direct_reading_) {  // another thread reads the descriptor: closing it now could let a new socket reuse it
      close_after_direct_ = true;
      return;
    }
    Lowest().close();
  }

  // The handler is done with the DirectBody it took (on the loop, when the request's Body goes).
  void EndDirect(const DirectSocketBody& direct) {
    direct_reading_ = false;
    body_bytes_ += direct.received();
    body_complete_ = direct.complete();
    if (close_after_direct_) {
      close_after_direct_ = false;
      Lowest().close();
    }
  }

  asio::awaitable<void> Loop() {
    beast::error_code ec;
    if constexpr (kTls) {
      Lowest().expires_after(opts_.header_timeout);
      co_await stream_.async_handshake(asio::ssl::stream_base::server, redirect_error(use_awaitable, ec));
      if (ec) {
        PARSYN_LOG_DEBUG("http: TLS handshake with {} failed: {}", remote_, ec.message());
        co_return;
      }
      if (!opts_.tls_client_ca.empty()) client_identity_ = VerifiedPeerIdentity(stream_.native_handle());
    }
    while (!state_->is_stopping && !closed_) {
      idle_ = true;
      RequestParser parser;
      parser.header_limit(opts_.max_header_bytes);
      parser.body_limit(std::numeric_limits<uint64_t>::max());  // caps are per route, enforced while reading
      Lowest().expires_after(opts_.header_timeout);
      co_await bhttp::async_read_header(stream_, buffer_, parser, redirect_error(use_awaitable, ec));
      idle_ = false;
      if (ec) {
        // end_of_stream, timeout and closed sockets end the connection quietly; malformed requests get a 400.
        // The answers are named before the co_await (kCoAwaitTemporaries).
        if (ec == bhttp::error::header_limit) {
          Response too_large = ErrorBody(431, "invalid_argument",
                                         "request header exceeds " + std::to_string(opts_.max_header_bytes) + " bytes");
          co_await Write(std::move(too_large), 11, false);
        } else if (IsHttpParseError(ec)) {
          Response malformed = ErrorBody(400, "invalid_argument", "malformed HTTP request: " + ec.message());
          co_await Write(std::move(malformed), 11, false);
        }
        co_return;
      }
      bool keep_alive = co_await Serve(parser);
      if (!keep_alive) {
        if (!parser.is_done() && !body_complete_) co_await Linger();
        co_return;
      }
    }
  }

  // Handles one request whose header is in `parser`. Returns whether the connection may serve another one.
  asio::awaitable<bool> Serve(RequestParser& parser) {
    const auto& header = parser.get();
    Request req;
    req.target = std::string(header.target());
    req.remote_address = remote_;
    req.client_identity = client_identity_;
    for (const auto& field : header) {
      std::string name = ToLower(View(field.name_string()));
      auto [it, inserted] = req.headers.try_emplace(name, View(field.value()));
      if (!inserted) it->second.append(", ").append(View(field.value()));
    }
    req.request_id = RequestIdFor(req.Header("x-request-id"));
    auto start = std::chrono::steady_clock::now();
    body_bytes_ = 0;
    body_complete_ = false;
    Response res = co_await Dispatch(parser, req);
    res.headers.emplace_back("X-Request-Id", req.request_id);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (opts_.on_request) {
      uint64_t sent = res.body.size();
      if (!res.file.empty()) {
        std::error_code size_error;
        sent = std::filesystem::file_size(res.file, size_error);
        if (size_error) sent = 0;
      }
      opts_.on_request(RequestRecord{.request = req,
                                     .status = res.status,
                                     .duration = elapsed,
                                     .bytes_received = body_bytes_,
                                     .bytes_sent = sent});
    } else {
      // The path, not the target: query strings carry signatures and session ids, which logs must not keep.
      PARSYN_LOG_DEBUG("http: {} {} {} -> {} in {} ms", remote_, MethodName(req.method), req.path, res.status,
                       std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count());
    }
    bool keep_alive =
        parser.keep_alive() && (parser.is_done() || body_complete_) && !state_->is_stopping && !closed_ && !peer_gone_;
    bool head = req.method == Method::kHead;
    co_return co_await Write(std::move(res), header.version(), keep_alive, head);
  }

  asio::awaitable<Response> Dispatch(RequestParser& parser, Request& req) {
    std::optional<Method> method = ToMethod(parser.get().method());
    if (!method) {
      co_return ErrorBody(501, "not_implemented",
                          "method " + std::string(parser.get().method_string()) + " is not supported");
    }
    req.method = *method;
    std::string_view target = req.target;
    size_t question = target.find('?');
    std::string_view raw_path = target.substr(0, question);
    if (question != std::string_view::npos) {
      StatusOr<StringMap> query = ParseQuery(target.substr(question + 1));
      if (!query.ok()) co_return Response::Error(query.status());
      req.query = std::move(query).value();
    }
    StatusOr<std::string> path = PercentDecode(raw_path, false);
    if (!path.ok()) co_return Response::Error(path.status());
    req.path = std::move(path).value();

    StatusOr<Router::Match> match = state_->router.Find(*method, raw_path);
    if (!match.ok()) co_return Response::Error(match.status());
    if (!match->route) {
      if (match->allowed.empty()) {
        co_return Response::Error(NotFoundError("no route for " + std::string(MethodName(*method)) + " " + req.path));
      }
      co_return MethodNotAllowed(MethodName(*method), req.path, match->allowed);
    }
    const Router::Route& route = *match->route;
    req.params = std::move(match->params);
    req.route = route.pattern;
    // Credentials before the body: a request that fails them is answered without reading (or buffering) any of it.
    if (route.options.authorize) {
      if (Status allowed = route.options.authorize(req); !allowed.ok()) co_return Response::Error(allowed);
    }

    // GET and HEAD take no body: one is refused unread, so no client can hold a connection on an open route (health,
    // metrics, blobs, the dashboard) by trickling a body no handler wants.
    if ((*method == Method::kGet || *method == Method::kHead) && !parser.is_done()) {
      co_return Response::Error(InvalidArgumentError(std::string(MethodName(*method)) + " " + req.path +
                                                     " takes no request body; send the request without one"));
    }
    uint64_t cap = route.options.max_body_bytes ? route.options.max_body_bytes : opts_.max_body_bytes;
    if (parser.content_length() && *parser.content_length() > cap) {
      co_return Response::Error(ResourceExhaustedError("request body of " + std::to_string(*parser.content_length()) +
                                                       " bytes exceeds the limit of " + std::to_string(cap) +
                                                       " bytes"));
    }
    if (!parser.is_done() && beast::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
      bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, parser.get().version()};
      beast::error_code ec;
      Lowest().expires_after(opts_.write_timeout);
      co_await bhttp::async_write(stream_, cont, redirect_error(use_awaitable, ec));
      if (ec) co_return Response::Error(UnavailableError("client went away: " + ec.message()));
    }

    Body body(*this, parser, cap, route.options.stream_body ? route.options.min_body_rate : BodyRate{});
    req.connection = this;
    if (route.options.stream_body) {
      req.body_stream = &body;
    } else {
      body.SetDeadline(std::chrono::steady_clock::now() + opts_.buffered_body_deadline);
      while (true) {
        StatusOr<std::string_view> chunk = co_await body.Next();
        if (!chunk.ok()) co_return Response::Error(chunk.status());
        if (chunk->empty()) break;
        req.body.append(*chunk);
      }
    }

    request_parser_ = &parser;  // for WatchForClientClose, until the handler returns
    std::optional<Response> res;
    try {
      res = co_await route.handler(req);
    } catch (const std::exception& e) {
      PARSYN_LOG_ERROR("http: handler for {} {} threw: {}", MethodName(req.method), req.path, e.what());
    }
    EndClientWatch();
    if (res) co_return std::move(*res);
    co_return Response::Error(
        InternalError("internal error while handling " + std::string(MethodName(req.method)) + " " + req.path));
  }

  // The handler returned: its watch for the client's close ends before the connection reads or writes again.
  void EndClientWatch() {
    request_parser_ = nullptr;
    if (!client_watched_) return;
    client_watched_ = false;
    ++client_watch_generation_;
    beast::error_code ec;
    Lowest().socket().cancel(ec);  // the watch's wait is the only operation pending on the socket now
  }

  // Waits for the socket to turn readable without reading from it (a pipelined request stays for the next header
  // read), then peeks: nothing to read means the client closed its side; an error, that it reset the connection.
  static asio::awaitable<void> WatchClient(std::shared_ptr<Connection> self, uint64_t generation) {
    tcp::socket& socket = self->Lowest().socket();
    while (true) {
      beast::error_code ec;
      co_await socket.async_wait(tcp::socket::wait_read, redirect_error(use_awaitable, ec));
      if (generation != self->client_watch_generation_ || self->closed_) co_return;  // the handler returned
      if (ec) break;
      char byte = 0;
      const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) co_return;  // the client sent more: it is there
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      break;
    }
    self->peer_gone_ = true;
    self->closing_.Notify();
  }

  template <class Message>
  void SetHeaders(Message& msg, const Response& res, bool keep_alive) {
    msg.result(static_cast<unsigned>(res.status));
    msg.set(bhttp::field::server, "parsyn");
    if (!res.content_type.empty()) msg.set(bhttp::field::content_type, res.content_type);
    for (const auto& [name, value] : res.headers) msg.insert(name, value);
    msg.keep_alive(keep_alive);
  }

  // Writes the serializer's message piece by piece, so write_timeout bounds each gap rather than the whole body.
  // `header_only` answers HEAD: the header (with the body's Content-Length) and no body.
  template <class Serializer>
  asio::awaitable<bool> WriteAll(Serializer& serializer, bool header_only) {
    beast::error_code ec;
    if (header_only) {
      Lowest().expires_after(opts_.write_timeout);
      co_await bhttp::async_write_header(stream_, serializer, redirect_error(use_awaitable, ec));
      co_return !ec;
    }
    while (!serializer.is_done()) {
      Lowest().expires_after(opts_.write_timeout);
      co_await bhttp::async_write_some(stream_, serializer, redirect_error(use_awaitable, ec));
      if (ec) co_return false;
    }
    co_return true;
  }

  asio::awaitable<bool> Write(Response res, unsigned version, bool keep_alive, bool head = false) {
    if (res.event_producer) {
      co_await RunEvents(std::move(res), version);
      co_return false;
    }
    if (!res.file.empty()) {
      beast::file file;
      beast::error_code ec;
      file.open(res.file.c_str(), beast::file_mode::scan, ec);
      uint64_t size = ec ? 0 : file.size(ec);
      if (!ec) co_return co_await WriteFile(res, file, size, version, keep_alive, head);
      res = Response::Error(NotFoundError("cannot open " + res.file.filename().string() + ": " + ec.message()));
    }
    bhttp::response<bhttp::string_body> msg{bhttp::status::ok, version};
    SetHeaders(msg, res, keep_alive);
    msg.body() = std::move(res.body);
    msg.prepare_payload();
    bhttp::response_serializer<bhttp::string_body> serializer{msg};
    co_return co_await WriteAll(serializer, head) && keep_alive;
  }

  // Sends the header, then the file in large chunks (Beast's file_body would write 4 KiB at a time).
  asio::awaitable<bool> WriteFile(const Response& res, beast::file& file, uint64_t size, unsigned version,
                                  bool keep_alive, bool head) {
    bhttp::response<bhttp::empty_body> msg{bhttp::status::ok, version};
    SetHeaders(msg, res, keep_alive);
    msg.content_length(size);
    bhttp::response_serializer<bhttp::empty_body> serializer{msg};
    beast::error_code ec;
    Lowest().expires_after(opts_.write_timeout);
    co_await bhttp::async_write_header(stream_, serializer, redirect_error(use_awaitable, ec));
    if (ec || head) co_return !ec && keep_alive;
    std::unique_ptr<char[]> chunk(new char[kFileChunkBytes]);
    for (uint64_t left = size; left > 0;) {
      size_t n = file.read(chunk.get(), static_cast<size_t>(std::min<uint64_t>(left, kFileChunkBytes)), ec);
      if (ec || n == 0) {
        // The header promised `size` bytes; closing is the only honest way to say the body is cut short.
        PARSYN_LOG_ERROR("http: reading {} failed after {} of {} bytes: {}", res.file.string(), size - left, size,
                         ec ? ec.message() : "file shrank");
        co_return false;
      }
      Lowest().expires_after(opts_.write_timeout);
      co_await asio::async_write(stream_, asio::buffer(chunk.get(), n), redirect_error(use_awaitable, ec));
      if (ec) co_return false;
      left -= n;
    }
    co_return keep_alive;
  }

  // Sends the SSE header, then lets the producer write chunked frames until it returns or the stream closes.
  asio::awaitable<void> RunEvents(Response res, unsigned version) {
    bhttp::response<bhttp::empty_body> msg{bhttp::status::ok, version};
    SetHeaders(msg, res, false);
    msg.set(bhttp::field::cache_control, "no-cache");
    msg.set("X-Accel-Buffering", "no");  // ask reverse proxies not to buffer the stream
    msg.chunked(true);
    bhttp::response_serializer<bhttp::empty_body> serializer{msg};
    beast::error_code ec;
    Lowest().expires_after(opts_.write_timeout);
    co_await bhttp::async_write_header(stream_, serializer, redirect_error(use_awaitable, ec));
    if (ec) co_return;
    Lowest().expires_never();
    // A read that only ends when the client closes its side: how we notice a client leaving an idle stream.
    asio::co_spawn(stream_.get_executor(), WatchForClose(this->shared_from_this()), asio::detached);
    Events events(*this);
    try {
      co_await res.event_producer(events);
    } catch (const std::exception& e) {
      PARSYN_LOG_ERROR("http: event producer threw: {}", e.what());
    }
    if (events.writable()) {  // end the chunked body cleanly, also when the server is stopping
      Lowest().expires_after(opts_.write_timeout);
      co_await asio::async_write(stream_, bhttp::make_chunk_last(), redirect_error(use_awaitable, ec));
    }
  }

  static asio::awaitable<void> WatchForClose(std::shared_ptr<Connection> self) {
    std::array<char, 512> sink;
    beast::error_code ec;
    while (!ec) {
      co_await self->stream_.async_read_some(asio::buffer(sink), redirect_error(use_awaitable, ec));
    }
    self->peer_gone_ = true;
    self->closing_.Notify();
  }

  // Reads and drops what is left of a rejected request body for a moment, then the connection closes.
  asio::awaitable<void> Linger() {
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    Lowest().expires_after(kLingerTime);
    std::array<char, 16 << 10> sink;
    uint64_t dropped = 0;
    while (!ec && dropped < kLingerBytes && !closed_) {
      dropped += co_await stream_.async_read_some(asio::buffer(sink), redirect_error(use_awaitable, ec));
    }
  }

  std::shared_ptr<Server::State> state_;
  const ServerOptions& opts_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::string remote_;
  std::optional<std::string> client_identity_;  // of the TLS handshake (Request::client_identity)
  loop::Signal closing_;  // notified when the connection is closed from outside or the client leaves (SSE, WatchClient)
  bool idle_ = true;
  bool closed_ = false;
  bool peer_gone_ = false;
  // The request being handled (null between requests), and whether its handler asked to watch for the client's
  // close (WatchForClientClose); the generation tells a watch of an earlier request that it is over.
  RequestParser* request_parser_ = nullptr;
  bool client_watched_ = false;
  uint64_t client_watch_generation_ = 0;
  uint64_t body_bytes_ = 0;  // of the request being served (ServerOptions::on_request)
  // A DirectBody reads this request's body on another thread: the body is complete without the parser knowing it
  // (body_complete_), and closing waits for the reader (close_after_direct_).
  bool body_complete_ = false;
  bool direct_reading_ = false;
  bool close_after_direct_ = false;
};

template <class Stream>
class Connection<Stream>::Events final : public EventStream {
 public:
  explicit Events(Connection& conn) : conn_(conn) {}

  asio::awaitable<bool> Send(std::string_view event, std::string_view data, std::string_view id) override {
    co_return co_await WriteChunk(FormatEvent(event, data, id));
  }

  asio::awaitable<bool> SendAll(std::span<const Frame> frames) override {
    if (frames.empty()) co_return open();
    std::string all;
    for (const Frame& f : frames) all += FormatEvent(f.event, f.data, f.id);
    co_return co_await WriteChunk(std::move(all));
  }

  asio::awaitable<bool> Comment(std::string_view text) override {
    std::string frame = ": " + std::string(text) + "\n\n";  // named first: kCoAwaitTemporaries
    co_return co_await WriteChunk(std::move(frame));
  }

  asio::awaitable<bool> Wait(loop::Signal& signal) override {
    while (open()) {
      std::array<loop::Signal*, 3> signals{&signal, &conn_.closing_, &conn_.state_->stopping};
      int woken = co_await loop::WaitAny(signals, conn_.opts_.sse_keepalive);
      if (woken == 0) co_return true;
      if (woken > 0) co_return false;
      if (!co_await Comment("keep-alive")) co_return false;
    }
    co_return false;
  }

  bool open() const override { return writable() && !conn_.state_->is_stopping; }
  bool writable() const { return !write_failed_ && !conn_.peer_gone_ && !conn_.closed_; }

 private:
  asio::awaitable<bool> WriteChunk(std::string frame) {
    if (!open()) co_return false;
    beast::error_code ec;
    conn_.Lowest().expires_after(conn_.opts_.write_timeout);
    co_await asio::async_write(conn_.stream_, bhttp::make_chunk(asio::buffer(frame)),
                               redirect_error(use_awaitable, ec));
    conn_.Lowest().expires_never();
    if (ec) write_failed_ = true;
    co_return !ec;
  }

  Connection& conn_;
  bool write_failed_ = false;
};

// A connection beyond the caps: within kRefusalTime, the TLS handshake (if any) and `res` (with Connection: close),
// then the end of our side, a short drain of what the client sent (closing with unread bytes would make the kernel
// send a reset, which can destroy the answer before the client reads it), and the close.
template <class Stream>
asio::awaitable<void> Refuse(std::shared_ptr<Server::State> state, Stream stream, Response res) {
  ++state->refusals;
  struct Done {
    Server::State& state;
    ~Done() { --state.refusals; }
  } done{*state};
  auto& lowest = beast::get_lowest_layer(stream);
  beast::error_code ec;
  lowest.expires_after(kRefusalTime);
  if constexpr (!std::is_same_v<Stream, beast::tcp_stream>) {
    co_await stream.async_handshake(asio::ssl::stream_base::server, redirect_error(use_awaitable, ec));
    if (ec) co_return;
  }
  bhttp::response<bhttp::string_body> msg{static_cast<bhttp::status>(res.status), 11};
  msg.set(bhttp::field::server, "parsyn");
  msg.set(bhttp::field::content_type, res.content_type);
  for (const auto& [name, value] : res.headers) msg.insert(name, value);
  msg.keep_alive(false);
  msg.body() = std::move(res.body);
  msg.prepare_payload();
  co_await bhttp::async_write(stream, msg, redirect_error(use_awaitable, ec));
  if (ec) co_return;
  lowest.socket().shutdown(tcp::socket::shutdown_send, ec);
  lowest.expires_after(kLingerTime);
  std::array<char, 4096> sink;
  uint64_t drained = 0;
  while (!ec && drained < kRefusalDrainBytes) {
    drained += co_await lowest.async_read_some(asio::buffer(sink), redirect_error(use_awaitable, ec));
  }
  lowest.close();
}

// Keeps an admitted connection's slot in the caps until the connection's coroutine ends.
template <class Conn>
asio::awaitable<void> RunAdmitted(std::shared_ptr<Conn> conn, std::unique_ptr<ConnectionSlot> slot) {
  co_await Conn::Run(std::move(conn));
}

}  // namespace parsyn::http

// The request body reader, Connection<Stream>::Body: a file of its own for its size, part of this header.
#include "http/connection_body.h"  // IWYU pragma: export
