// libFuzzer entry for the HTTP server's own request parsing: each input is sent as raw bytes over a loopback TCP
// connection to a real http::Server, started once with its default options (header limit, body cap, timeouts) and
// routes of each kind: a buffered JSON body parsed by a protocol reader, a streamed body with its own cap, path
// parameters and query strings. So the input goes through what a request from a worker goes through: Beast's parser
// as the server configures it, pipelined keep-alive requests, chunked and Content-Length bodies, 100-continue,
// target and query decoding, routing. Besides the sanitizers' checks it asserts: the server ends every connection
// (it answers, then closes once the client has sent everything), and whatever it writes is an HTTP/1.x response.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "base/log.h"
#include "http/server.h"
#include "protocol/messages.h"

namespace {

using namespace parsyn;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_http_request: %s %s\n", what, detail.c_str());
  std::abort();
}

http::Router Routes() {
  http::Router router;
  auto must = [](Status s) {
    if (!s.ok()) Fail("cannot add a route:", s.ToString());
  };
  // A buffered JSON body, as the worker protocol's routes have.
  must(router.Add(http::Method::kPost, "/api/v1/worker/hello",
                  [](http::Request& req) -> http::Awaitable<http::Response> {
                    StatusOr<protocol::Hello> hello = protocol::ParseHello(req.body);
                    if (!hello.ok()) co_return http::Response::Error(hello.status());
                    co_return http::Response::Json(200, protocol::HelloToJson(*hello));
                  }));
  // A streamed body with a small cap of its own, as blob uploads have.
  must(router.Add(
      http::Method::kPut, "/blobs/{key...}",
      [](http::Request& req) -> http::Awaitable<http::Response> {
        uint64_t bytes = 0;
        while (true) {
          StatusOr<std::string_view> chunk = co_await req.body_stream->Next();
          if (!chunk.ok()) co_return http::Response::Error(chunk.status());
          if (chunk->empty()) break;
          bytes += chunk->size();
        }
        co_return http::Response::Json(201, {{"key", req.params["key"]}, {"size_bytes", bytes}});
      },
      http::RouteOptions{.stream_body = true, .max_body_bytes = 2048}));
  // Path parameters and the query.
  must(router.Add(http::Method::kGet, "/api/v1/training-jobs/{id}/rounds/{round}",
                  [](http::Request& req) -> http::Awaitable<http::Response> {
                    nlohmann::json query = nlohmann::json::object();
                    for (const auto& [k, v] : req.query) query[k] = v;
                    co_return http::Response::Json(
                        200, {{"id", req.params["id"]}, {"round", req.params["round"]}, {"query", query}});
                  }));
  return router;
}

// The server, on a loop thread of its own for the whole run.
struct Running {
  boost::asio::io_context io;
  std::unique_ptr<http::Server> server;
  std::thread loop;
  uint16_t port = 0;
};

Running& Server() {
  static Running* running = [] {
    log::Init("error");
    auto* r = new Running;
    StatusOr<std::unique_ptr<http::Server>> server = http::Server::Start(r->io, http::ServerOptions{}, Routes());
    if (!server.ok()) Fail("cannot start the server:", server.status().ToString());
    r->server = std::move(*server);
    r->port = r->server->port();
    r->loop = std::thread([r] { r->io.run(); });
    return r;
  }();
  return *running;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint16_t port = Server().port;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Fail("socket:", std::strerror(errno));
  // A server that neither answers nor closes within this is a hang (it waits for nothing: the input is all sent).
  timeval timeout{.tv_sec = 20, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Fail("the server no longer accepts connections:", std::strerror(errno));
  }
  // The server may answer and close before reading everything (a refused header, a body over its cap): a failed
  // send is then expected.
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      answer.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) Fail("the server neither answered nor closed");
    break;  // closed (or reset after answering)
  }
  ::close(fd);
  if (!answer.empty() && !answer.starts_with("HTTP/1."))
    Fail("the server wrote something else than a response:", answer.substr(0, 200));
  return 0;
}
