#include "http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "base/testing/raw_socket.h"
#include "http/client.h"
#include "http/test_server.h"

namespace parsyn::http {
namespace {

namespace net = boost::asio;
using std::chrono::milliseconds;
using testing::TestServer;

// --- Router (no sockets) ---

Handler Named(std::string name) {
  return [name](Request&) -> Awaitable<Response> { co_return Response::Text(200, name); };
}

TEST(RouterTest, MatchesLiteralsParamsAndRest) {
  Router router;
  ASSERT_TRUE(router.Add(Method::kGet, "/api/v1/training-jobs/{id}", Named("get")).ok());
  ASSERT_TRUE(router.Add(Method::kGet, "/api/v1/training-jobs/{id}/rounds/{round}", Named("round")).ok());
  ASSERT_TRUE(router.Add(Method::kGet, "/api/v1/training-jobs/stats", Named("stats")).ok());
  ASSERT_TRUE(router.Add(Method::kPut, "/blobs/{key...}", Named("blob")).ok());

  auto m = router.Find(Method::kGet, "/api/v1/training-jobs/17");
  ASSERT_TRUE(m.ok());
  ASSERT_NE(m->route, nullptr);
  EXPECT_EQ(m->params.at("id"), "17");

  m = router.Find(Method::kGet, "/api/v1/training-jobs/a%20b/rounds/3");
  ASSERT_TRUE(m.ok() && m->route);
  EXPECT_EQ(m->params.at("id"), "a b");
  EXPECT_EQ(m->params.at("round"), "3");

  // The literal route beats the parameter route whatever the order they were added in.
  m = router.Find(Method::kGet, "/api/v1/training-jobs/stats");
  ASSERT_TRUE(m.ok() && m->route);
  EXPECT_TRUE(m->params.empty());

  m = router.Find(Method::kPut, "/blobs/jobs/17/rounds/000003/global.safetensors");
  ASSERT_TRUE(m.ok() && m->route);
  EXPECT_EQ(m->params.at("key"), "jobs/17/rounds/000003/global.safetensors");

  m = router.Find(Method::kGet, "/api/v1/training-jobs");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->route, nullptr);
  EXPECT_TRUE(m->allowed.empty());

  m = router.Find(Method::kDelete, "/api/v1/training-jobs/17");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->route, nullptr);
  EXPECT_EQ(m->allowed, std::vector<Method>{Method::kGet});

  EXPECT_EQ(router.Find(Method::kGet, "/api/v1/training-jobs/%zz").status().code(), StatusCode::kInvalidArgument);
}

TEST(RouterTest, RejectsBadPatternsAndDuplicates) {
  Router router;
  EXPECT_EQ(router.Add(Method::kGet, "no-slash", Named("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(router.Add(Method::kGet, "/a/{rest...}/b", Named("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(router.Add(Method::kGet, "/a/x{id}", Named("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(router.Add(Method::kGet, "/a/{}", Named("x")).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(router.Add(Method::kGet, "/a/{id}", Named("x")).ok());
  EXPECT_EQ(router.Add(Method::kGet, "/a/{id}", Named("y")).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(router.Add(Method::kPost, "/a/{id}", Named("y")).ok());
}

// --- Server over real sockets ---

ClientOptions FastClient(const std::string& url) {
  ClientOptions o;
  o.base_url = url;
  o.timeout = milliseconds(10'000);
  o.backoff_initial = milliseconds(10);
  o.backoff_max = milliseconds(50);
  return o;
}

Router ApiRouter() {
  Router router;
  EXPECT_TRUE(router
                  .Add(Method::kGet, "/api/v1/training-jobs/{id}",
                       [](Request& req) -> Awaitable<Response> {
                         co_return Response::Json(200, {{"id", req.params.at("id")},
                                                        {"limit", req.query["limit"]},
                                                        {"auth", std::string(req.Header("AUTHORIZATION"))}});
                       })
                  .ok());
  EXPECT_TRUE(router
                  .Add(
                      Method::kPost, "/api/v1/echo",
                      [](Request& req) -> Awaitable<Response> {
                        StatusOr<nlohmann::json> body = req.JsonBody();
                        if (!body.ok()) co_return Response::Error(body.status());
                        co_return Response::Json(201, *body);
                      },
                      RouteOptions{.max_body_bytes = 1024})
                  .ok());
  EXPECT_TRUE(router
                  .Add(Method::kDelete, "/api/v1/training-jobs/{id}",
                       [](Request& req) -> Awaitable<Response> {
                         co_return Response::Error(
                             FailedPreconditionError("job " + req.params.at("id") + " already finished"));
                       })
                  .ok());
  return router;
}

TEST(ServerTest, RoutesWithPathAndQueryParameters) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  ClientOptions options = FastClient(ts.url());
  options.bearer_token = "secret-token";
  Client client(options);
  auto r = client.Get("/api/v1/training-jobs/42?limit=5");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  auto json = r->Json();
  ASSERT_TRUE(json.ok());
  EXPECT_EQ((*json)["id"], "42");
  EXPECT_EQ((*json)["limit"], "5");
  EXPECT_EQ((*json)["auth"], "Bearer secret-token");

  auto echo = client.PostJson("/api/v1/echo", {{"name", "job"}, {"n", 3}});
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_EQ(echo->status, 201);
  EXPECT_EQ(*echo->Json(), (nlohmann::json{{"name", "job"}, {"n", 3}}));
}

// on_request hears of each request with its route pattern (none for an unmatched path), status and body sizes.
TEST(ServerTest, OnRequestGetsTheRoutePatternStatusAndBodyBytes) {
  struct Seen {
    std::string method, path, route;
    int status;
    uint64_t received, sent;
  };
  std::vector<Seen> seen;  // appended on the loop thread, read after the server stopped
  net::io_context io;
  ServerOptions options;
  options.on_request = [&seen](const RequestRecord& r) {
    seen.push_back({std::string(MethodName(r.request.method)), r.request.path, r.request.route, r.status,
                    r.bytes_received, r.bytes_sent});
  };
  {
    TestServer ts(io, ApiRouter(), options);
    Client client(FastClient(ts.url()));
    auto got = client.Get("/api/v1/training-jobs/42?limit=5");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto echo = client.PostJson("/api/v1/echo", {{"n", 3}});
    ASSERT_TRUE(echo.ok()) << echo.status().ToString();
    EXPECT_FALSE(client.Get("/api/v1/nope").ok());
    ts.Stop(std::chrono::milliseconds(2000));
    ASSERT_EQ(seen.size(), 3u);
    EXPECT_EQ(seen[0].route, "/api/v1/training-jobs/{id}");
    EXPECT_EQ(seen[0].path, "/api/v1/training-jobs/42");
    EXPECT_EQ(seen[0].status, 200);
    EXPECT_EQ(seen[0].sent, got->body.size());
    EXPECT_EQ(seen[1].method, "POST");
    EXPECT_EQ(seen[1].route, "/api/v1/echo");
    EXPECT_EQ(seen[1].status, 201);
    EXPECT_EQ(seen[1].received, std::string(R"({"n":3})").size());
    EXPECT_EQ(seen[2].route, "");
    EXPECT_EQ(seen[2].status, 404);
  }
}

TEST(ServerTest, UnknownPathIs404AndWrongMethodIs405WithErrorBody) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  Client client(FastClient(ts.url()));

  auto missing = client.Get("/api/v1/nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "GET " + ts.url() + "/api/v1/nope: HTTP 404: no route for GET /api/v1/nope");

  auto wrong = client.Send(Method::kPut, "/api/v1/training-jobs/42", "{}", "application/json");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);  // 405 has no code of its own
  EXPECT_NE(wrong.status().message().find("HTTP 405: PUT is not allowed on /api/v1/training-jobs/42 (allowed: "),
            std::string::npos)
      << wrong.status().message();

  // The raw body shape, as any API client sees it.
  auto raw = client.Send(Method::kDelete, "/api/v1/training-jobs/7", "", "", CallOptions{.retry = false});
  EXPECT_EQ(raw.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(raw.status().message(), "DELETE " + ts.url() + "/api/v1/training-jobs/7: HTTP 409: job 7 already finished");
}

TEST(ServerTest, ErrorBodyHasCodeAndMessage) {
  Response r = Response::Error(InvalidArgumentError("max_workers must be >= min_workers"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.content_type, "application/json");
  nlohmann::json expected = {
      {"error", {{"code", "invalid_argument"}, {"message", "max_workers must be >= min_workers"}}}};
  EXPECT_EQ(nlohmann::json::parse(r.body), expected);
  EXPECT_EQ(Response::Error(ResourceExhaustedError("too big")).status, 413);
  EXPECT_EQ(Response::Error(NotFoundError("x")).status, 404);
}

TEST(ServerTest, OversizeJsonBodyIs413AndMalformedJsonIs400) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  Client client(FastClient(ts.url()));

  std::string big = "{\"pad\": \"" + std::string(4096, 'x') + "\"}";
  auto r = client.Send(Method::kPost, "/api/v1/echo", big, "application/json");
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("HTTP 413: request body of " + std::to_string(big.size()) +
                                      " bytes exceeds the limit of 1024 bytes"),
            std::string::npos)
      << r.status().message();

  auto bad = client.Send(Method::kPost, "/api/v1/echo", "{\"a\": ", "application/json");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("HTTP 400: request body is not valid JSON"), std::string::npos)
      << bad.status().message();

  // The server is unharmed and the client can go on.
  auto ok = client.PostJson("/api/v1/echo", {{"a", 1}});
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

std::string Hex(const unsigned char* digest, unsigned size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < size; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return Hex(digest, size);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("parsyn_http_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(ServerTest, StreamsUploadToFileAndDownloadFromFile) {
  TempDir dir;
  std::filesystem::path store = dir.path() / "store";
  std::filesystem::create_directories(store);
  size_t largest_chunk = 0;

  Router router;
  ASSERT_TRUE(router
                  .Add(
                      Method::kPut, "/blobs/{key...}",
                      [&](Request& req) -> Awaitable<Response> {
                        std::filesystem::path out = store / std::filesystem::path(req.params.at("key")).filename();
                        std::ofstream file(out, std::ios::binary);
                        EVP_MD_CTX* sha = EVP_MD_CTX_new();
                        EVP_DigestInit_ex(sha, EVP_sha256(), nullptr);
                        uint64_t total = 0;
                        while (true) {
                          StatusOr<std::string_view> chunk = co_await req.body_stream->Next();
                          if (!chunk.ok()) {
                            EVP_MD_CTX_free(sha);
                            co_return Response::Error(chunk.status());
                          }
                          if (chunk->empty()) break;
                          largest_chunk = std::max(largest_chunk, chunk->size());
                          total += chunk->size();
                          file.write(chunk->data(), static_cast<std::streamsize>(chunk->size()));
                          EVP_DigestUpdate(sha, chunk->data(), chunk->size());
                        }
                        unsigned char digest[EVP_MAX_MD_SIZE];
                        unsigned int size = 0;
                        EVP_DigestFinal_ex(sha, digest, &size);
                        EVP_MD_CTX_free(sha);
                        std::string hex = Hex(digest, size);
                        co_return Response::Json(201, {{"bytes", total},
                                                       {"sha256", hex},
                                                       {"buffered", req.body.size()},
                                                       {"content_length", *req.body_stream->content_length()}});
                      },
                      RouteOptions{.stream_body = true, .max_body_bytes = 64 << 20})
                  .ok());
  ASSERT_TRUE(router
                  .Add(Method::kGet, "/blobs/{key...}",
                       [&](Request& req) -> Awaitable<Response> {
                         co_return Response::File(store / std::filesystem::path(req.params.at("key")).filename());
                       })
                  .ok());
  net::io_context io;
  TestServer ts(io, std::move(router));
  Client client(FastClient(ts.url()));

  std::string blob(6 << 20, '\0');
  std::mt19937 rng(7);
  for (char& c : blob) c = static_cast<char>(rng());
  std::filesystem::path src = dir.path() / "update.safetensors";
  std::ofstream(src, std::ios::binary).write(blob.data(), static_cast<std::streamsize>(blob.size()));

  auto up = client.UploadFile(Method::kPut, "/blobs/jobs/1/update.safetensors", src);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  auto json = *up->Json();
  EXPECT_EQ(json["bytes"], blob.size());
  EXPECT_EQ(json["content_length"], blob.size());
  EXPECT_EQ(json["sha256"], Sha256Hex(blob));
  EXPECT_EQ(json["buffered"], 0);
  EXPECT_LE(largest_chunk, size_t{64 << 10});  // the body came in chunks, never whole

  std::filesystem::path dest = dir.path() / "downloaded.safetensors";
  auto down = client.DownloadToFile("/blobs/jobs/1/update.safetensors", dest);
  ASSERT_TRUE(down.ok()) << down.status().ToString();
  EXPECT_EQ(*down, blob.size());
  EXPECT_EQ(Sha256Hex(ReadFile(dest)), Sha256Hex(blob));
  EXPECT_FALSE(std::filesystem::exists(dest.string() + ".part"));

  // A missing blob is a 404 and leaves no file behind.
  std::filesystem::path none = dir.path() / "none";
  auto missing = client.DownloadToFile("/blobs/jobs/1/absent", none);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(none));
  EXPECT_FALSE(std::filesystem::exists(none.string() + ".part"));
}

TEST(ServerTest, StreamedUploadOverTheRouteCapIs413) {
  Router router;
  ASSERT_TRUE(router
                  .Add(
                      Method::kPut, "/blobs/{key...}",
                      [](Request& req) -> Awaitable<Response> {
                        while (true) {
                          StatusOr<std::string_view> chunk = co_await req.body_stream->Next();
                          if (!chunk.ok()) co_return Response::Error(chunk.status());
                          if (chunk->empty()) break;
                        }
                        co_return Response::NoContent();
                      },
                      RouteOptions{.stream_body = true, .max_body_bytes = 100'000})
                  .ok());
  net::io_context io;
  TestServer ts(io, std::move(router));
  Client client(FastClient(ts.url()));
  auto r = client.Send(Method::kPut, "/blobs/a", std::string(200'000, 'x'), "application/octet-stream");
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
}

// Shared state of the event-stream and long-poll routes; touched only on the loop thread.
struct Feed {
  explicit Feed(net::io_context& io) : changed(io.get_executor()) {}
  loop::Signal changed;
  std::vector<std::string> items;
  bool closed = false;
  std::promise<void> producer_done;
  std::promise<void> waiting;
};

Router FeedRouter(Feed& feed) {
  Router router;
  EXPECT_TRUE(router
                  .Add(Method::kGet, "/events",
                       [&feed](Request&) -> Awaitable<Response> {
                         co_return Response::Events([&feed](EventStream& stream) -> Awaitable<void> {
                           size_t sent = 0;
                           while (true) {
                             for (; sent < feed.items.size(); ++sent) {
                               const std::string id = std::to_string(sent);  // kCoAwaitTemporaries
                               if (!co_await stream.Send("item", feed.items[sent], id)) break;
                             }
                             if (feed.closed || !stream.open()) break;
                             if (!co_await stream.Wait(feed.changed)) break;
                           }
                           feed.producer_done.set_value();
                         });
                       })
                  .ok());
  EXPECT_TRUE(router
                  .Add(Method::kGet, "/poll",
                       [&feed](Request& req) -> Awaitable<Response> {
                         milliseconds timeout(std::stoi(req.query.at("timeout_ms")));
                         feed.waiting.set_value();
                         bool woke = co_await feed.changed.Wait(timeout);
                         co_return Response::Json(200, {{"woke", woke}, {"items", feed.items.size()}});
                       })
                  .ok());
  return router;
}

TEST(ServerTest, EventStreamDeliversEventsInOrderWithKeepAlives) {
  net::io_context io;
  Feed feed(io);
  ServerOptions options;
  options.sse_keepalive = milliseconds(20);  // comments flow between events; the client must skip them
  TestServer ts(io, FeedRouter(feed), options);
  Client client(FastClient(ts.url()));

  std::thread publisher([&] {
    for (int i = 0; i < 5; ++i) {
      ts.RunOnLoop([&, i] {
        feed.items.push_back(i == 2 ? "line one\nline two" : "item " + std::to_string(i));
        if (i == 4) feed.closed = true;
        feed.changed.Notify();
      });
    }
  });
  std::vector<SseEvent> got;
  Status s = client.ReadEvents("/events", [&](const SseEvent& e) {
    got.push_back(e);
    return true;
  });
  publisher.join();
  ASSERT_TRUE(s.ok()) << s.ToString();  // the server ended the stream after the fifth item
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(got[i].event, "item");
    EXPECT_EQ(got[i].id, std::to_string(i));
  }
  EXPECT_EQ(got[0].data, "item 0");
  EXPECT_EQ(got[2].data, "line one\nline two");
  EXPECT_EQ(got[4].data, "item 4");
}

TEST(ServerTest, EventProducerSeesTheClientLeave) {
  net::io_context io;
  Feed feed(io);
  TestServer ts(io, FeedRouter(feed));
  ts.RunOnLoop([&] { feed.items = {"a", "b", "c"}; });
  Client client(FastClient(ts.url()));
  int seen = 0;
  Status s = client.ReadEvents("/events", [&](const SseEvent&) { return ++seen < 2; });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, 2);
  // The producer is parked in Wait() with nothing to send; only noticing the closed socket can end it.
  EXPECT_EQ(feed.producer_done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

TEST(ServerTest, LongPollTimesOutWhenNothingHappens) {
  net::io_context io;
  Feed feed(io);
  TestServer ts(io, FeedRouter(feed));
  Client client(FastClient(ts.url()));
  auto start = std::chrono::steady_clock::now();
  auto r = client.Get("/poll?timeout_ms=150");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r->Json())["woke"], false);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(150));
}

TEST(ServerTest, LongPollWakesWhenNotified) {
  net::io_context io;
  Feed feed(io);
  TestServer ts(io, FeedRouter(feed));
  Client client(FastClient(ts.url()));
  std::thread notifier([&] {
    feed.waiting.get_future().wait();
    ts.RunOnLoop([&] {
      feed.items.push_back("task");
      feed.changed.Notify();
    });
  });
  auto start = std::chrono::steady_clock::now();
  auto r = client.Get("/poll?timeout_ms=20000");
  notifier.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r->Json())["woke"], true);
  EXPECT_EQ((*r->Json())["items"], 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(10'000));
}

// Connects a raw socket; returns its fd.
int ConnectRaw(uint16_t port) {
  const int fd = test_support::ConnectLoopback(port);
  EXPECT_GE(fd, 0) << "cannot connect to port " << port;
  return fd;
}

// Waits up to `limit` for the peer to close; returns true when it did.
bool PeerClosesWithin(int fd, milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int left =
        static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

TEST(ServerTest, IdleTimeoutClosesASilentConnection) {
  net::io_context io;
  ServerOptions options;
  options.header_timeout = milliseconds(200);
  TestServer ts(io, ApiRouter(), options);
  int fd = ConnectRaw(ts.server().port());
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(PeerClosesWithin(fd, milliseconds(5000)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(150));
  ::close(fd);
}

TEST(ServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  int fd = ConnectRaw(ts.server().port());
  std::string two =
      "GET /api/v1/training-jobs/1 HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /api/v1/training-jobs/2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, two.data(), two.size(), 0), static_cast<ssize_t>(two.size()));
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_NE(received.find("\"id\":\"1\""), std::string::npos) << received;
  EXPECT_NE(received.find("\"id\":\"2\""), std::string::npos) << received;
}

// Small bodies arrive with their header, often with the next request behind them: they are parsed from what was
// already read (no read of the socket, no pass of the loop's queue), and each request keeps exactly its own bytes.
TEST(ServerTest, BodiesThatArriveWithTheirHeaderOrAfterItAreReadWhole) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  int fd = ConnectRaw(ts.server().port());
  auto post = [](const std::string& body, const std::string& extra = "") {
    return "POST /api/v1/echo HTTP/1.1\r\nHost: x\r\n" + extra + "Content-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  };
  // Three pipelined in one write (two with a Content-Length, one chunked), then one whose body comes later in
  // two pieces.
  const std::string pipelined = post(R"({"n":1})") + post(R"({"n":2,"s":"two"})") +
                                "POST /api/v1/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "4\r\n{\"n\"\r\n3\r\n:3}\r\n0\r\n\r\n";
  ASSERT_EQ(::send(fd, pipelined.data(), pipelined.size(), 0), static_cast<ssize_t>(pipelined.size()));
  const std::string last = post(R"({"n":4,"tail":"after the header"})", "Connection: close\r\n");
  const size_t split = last.find("\r\n\r\n") + 4 + 6;  // the header and 6 bytes of the body
  ASSERT_EQ(::send(fd, last.data(), split, 0), static_cast<ssize_t>(split));
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_EQ(::send(fd, last.data() + split, 10, 0), 10);
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_EQ(::send(fd, last.data() + split + 10, last.size() - split - 10, 0),
            static_cast<ssize_t>(last.size() - split - 10));
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  size_t at = 0;
  for (const char* echoed :
       {R"({"n":1})", R"({"n":2,"s":"two"})", R"({"n":3})", R"({"n":4,"tail":"after the header"})"}) {
    const size_t found = received.find(std::string("HTTP/1.1 201 Created"), at);
    ASSERT_NE(found, std::string::npos) << received;
    at = received.find(echoed, found);
    ASSERT_NE(at, std::string::npos) << echoed << " in " << received;
  }
}

// GET /wait?timeout_ms=N: a long-poll that waits only for its client to close the connection. Each wait's end is
// reported to `ended` (whether the client was gone); `started` hears of each wait's start.
struct ClientWatchLog {
  std::promise<void> started;
  std::promise<bool> ended;
};

Router ClientWatchRouter(ClientWatchLog& log) {
  Router router;
  EXPECT_TRUE(router
                  .Add(Method::kGet, "/wait",
                       [&log](Request& req) -> Awaitable<Response> {
                         loop::Signal& closed = req.connection->WatchForClientClose();
                         log.started.set_value();
                         co_await closed.Wait(milliseconds(std::stoi(req.query.at("timeout_ms"))));
                         log.ended.set_value(req.connection->client_gone());
                         co_return Response::Text(200, req.connection->client_gone() ? "gone" : "stayed");
                       })
                  .ok());
  EXPECT_TRUE(router.Add(Method::kGet, "/after", Named("served after the wait")).ok());
  return router;
}

// The server learns of a closed connection only when it writes; a long-poll that watches its connection hears of the
// client's close at once (a killed worker must not look present until its poll ends).
TEST(ServerTest, WaitingHandlerHearsItsClientCloseTheConnection) {
  net::io_context io;
  ClientWatchLog log;
  TestServer ts(io, ClientWatchRouter(log));
  int fd = ConnectRaw(ts.server().port());
  const std::string request = "GET /wait?timeout_ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  log.started.get_future().wait();
  ::close(fd);
  auto ended = log.ended.get_future();
  // The wait is 60 s: only the watch can end it this soon.
  ASSERT_EQ(ended.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(ended.get());
}

// A request the client pipelines while the handler waits is the client still there: the watch ends without reading
// it, and the connection serves it after the wait's answer.
TEST(ServerTest, APipelinedRequestEndsTheWatchUnreadAndIsServedNext) {
  net::io_context io;
  ClientWatchLog log;
  TestServer ts(io, ClientWatchRouter(log));
  int fd = ConnectRaw(ts.server().port());
  const std::string first = "GET /wait?timeout_ms=300 HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, first.data(), first.size(), 0), static_cast<ssize_t>(first.size()));
  log.started.get_future().wait();
  const std::string second = "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, second.data(), second.size(), 0), static_cast<ssize_t>(second.size()));
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_FALSE(log.ended.get_future().get());
  const size_t stayed = received.find("stayed");
  EXPECT_NE(stayed, std::string::npos) << received;
  EXPECT_NE(received.find("served after the wait", stayed), std::string::npos) << received;
}

TEST(ServerTest, HeadGetsHeadersWithoutBody) {
  Router router;
  ASSERT_TRUE(router
                  .Add(Method::kHead, "/blobs/{key...}",
                       [](Request&) -> Awaitable<Response> { co_return Response::Text(200, "0123456789"); })
                  .ok());
  net::io_context io;
  TestServer ts(io, std::move(router));
  int fd = ConnectRaw(ts.server().port());
  std::string head = "HEAD /blobs/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ::send(fd, head.data(), head.size(), 0);
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received;
  EXPECT_NE(received.find("Content-Length: 10\r\n"), std::string::npos) << received;
  EXPECT_TRUE(received.ends_with("\r\n\r\n")) << received;
}

TEST(ServerTest, MalformedRequestGets400) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  int fd = ConnectRaw(ts.server().port());
  std::string junk = "GARBAGE\x01 / HTTP/1.1\r\n\r\n";
  ::send(fd, junk.data(), junk.size(), 0);
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 400")) << received;
  EXPECT_NE(received.find("\"code\":\"invalid_argument\""), std::string::npos) << received;
}

// --- Limits: connection caps, header deadline, credentials before the body, out of descriptors, body rate ---

// Connects a raw socket from `source` (any 127.x.y.z: all of 127/8 is the loopback); returns its fd.
int ConnectRawFrom(uint16_t port, const char* source) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0) << source;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << source;
  return fd;
}

// Sends `request` on a new connection from `source` and reads the answer until the server closes.
std::string Exchange(uint16_t port, const char* source, std::string_view request) {
  int fd = ConnectRawFrom(port, source);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  return received;
}

constexpr std::string_view kGetOne = "GET /api/v1/training-jobs/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

TEST(ServerLimitsTest, ConnectionsBeyondTheCapsGet429Or503WithRetryAfterAndAcceptingGoesOn) {
  net::io_context io;
  ServerOptions options;
  options.max_connections = 3;
  options.max_connections_per_address = 2;
  options.overload_retry_after = std::chrono::seconds(7);
  TestServer ts(io, ApiRouter(), options);
  const uint16_t port = ts.server().port();
  // Two idle connections from 127.0.0.1 fill its share; accepts are served in order, so the third one is over.
  int first = ConnectRawFrom(port, "127.0.0.1");
  int second = ConnectRawFrom(port, "127.0.0.1");
  std::string per_address = Exchange(port, "127.0.0.1", kGetOne);
  EXPECT_TRUE(per_address.starts_with("HTTP/1.1 429")) << per_address;
  EXPECT_NE(per_address.find("Retry-After: 7\r\n"), std::string::npos) << per_address;
  EXPECT_NE(per_address.find("\"code\":\"resource_exhausted\""), std::string::npos) << per_address;
  EXPECT_NE(per_address.find("too many connections from 127.0.0.1"), std::string::npos) << per_address;
  // Another address still gets the last place; then the server is full for everyone.
  int third = ConnectRawFrom(port, "127.0.0.2");
  std::string global = Exchange(port, "127.0.0.3", kGetOne);
  EXPECT_TRUE(global.starts_with("HTTP/1.1 503")) << global;
  EXPECT_NE(global.find("Retry-After: 7\r\n"), std::string::npos) << global;
  EXPECT_NE(global.find("\"code\":\"unavailable\""), std::string::npos) << global;

  // A burst far over the cap: every connection is answered (or closed), none served, and the acceptor goes on.
  std::vector<int> burst;
  for (int i = 0; i < 40; ++i) burst.push_back(ConnectRawFrom(port, "127.0.0.4"));
  for (int fd : burst) ::shutdown(fd, SHUT_WR);  // lets the server's drain end at once
  int refused = 0;
  for (int fd : burst) {
    std::string answer = test_support::ReadUntilClosed(fd);
    ::close(fd);
    EXPECT_TRUE(answer.empty() || answer.starts_with("HTTP/1.1 503")) << answer;
    refused += answer.starts_with("HTTP/1.1 503") ? 1 : 0;
  }
  EXPECT_GT(refused, 0);

  // The admitted connections are served, and a closed one gives its place back.
  ::send(third, kGetOne.data(), kGetOne.size(), MSG_NOSIGNAL);
  std::string served = test_support::ReadUntilClosed(third);
  EXPECT_TRUE(served.starts_with("HTTP/1.1 200")) << served;
  ::close(third);
  ::close(first);
  std::string again;
  for (int i = 0; i < 100 && !again.starts_with("HTTP/1.1 200"); ++i) {  // the server notices the closes soon
    again = Exchange(port, "127.0.0.1", kGetOne);
    if (!again.starts_with("HTTP/1.1 200")) std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(again.starts_with("HTTP/1.1 200")) << again;
  ::close(second);
}

TEST(ServerLimitsTest, HeaderTrickledByteByByteIsClosedAtTheHeaderDeadline) {
  net::io_context io;
  ServerOptions options;
  options.header_timeout = milliseconds(500);
  TestServer ts(io, ApiRouter(), options);
  int fd = ConnectRaw(ts.server().port());
  std::string start = "GET /api/v1/training-jobs/1 HTTP/1.1\r\nHost: x\r\n";
  ASSERT_GT(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), 0);
  // A slowloris: a header line every 50 ms keeps the connection busy but never finishes the header (1.2 KiB in
  // 5 s, far under max_header_bytes). Each byte must not buy more time.
  bool closed = false;
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(15'000);
  while (!closed && std::chrono::steady_clock::now() < give_up) {
    if (::send(fd, "X-A: 1\r\n", 8, MSG_NOSIGNAL) < 0) closed = true;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      char buf[256];
      closed = ::recv(fd, buf, sizeof buf, 0) <= 0 || closed;
    }
  }
  ::close(fd);
  EXPECT_TRUE(closed) << "a header trickled for 15 s was not cut at the 500 ms deadline";
}

// Waits up to `limit` for an answer on fd, then reads it to the close ("" when none came in time).
std::string AnswerWithin(int fd, milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return "";
  return test_support::ReadUntilClosed(fd);
}

// A GET with a body is refused unread: a client trickling a body to an open route cannot hold the
// connection for the body timeout.
TEST(ServerLimitsTest, GetWithABodyIsRefusedWithoutReadingIt) {
  net::io_context io;
  ServerOptions options;
  options.body_timeout = milliseconds(5000);  // reading the body would wait this long for it
  TestServer ts(io, ApiRouter(), options);
  for (std::string_view framing : {"Content-Length: 1000\r\n", "Transfer-Encoding: chunked\r\n"}) {
    int fd = ConnectRaw(ts.server().port());
    const std::string request = "GET /api/v1/training-jobs/1 HTTP/1.1\r\nHost: x\r\n" + std::string(framing) + "\r\n";
    ASSERT_GT(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), 0);
    const std::string answer = AnswerWithin(fd, milliseconds(3000));
    ::close(fd);
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 400")) << framing << ": " << answer;
    EXPECT_NE(answer.find("takes no request body"), std::string::npos) << answer;
  }
  // Without a body the same request is served.
  Client client(FastClient(ts.url()));
  auto served = client.Get("/api/v1/training-jobs/1");
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_EQ(served->status, 200);
}

// A buffered body trickled a byte at a time, each within the body timeout, is cut at the buffered-body deadline.
TEST(ServerLimitsTest, BufferedBodyTrickledIsCutAtItsDeadline) {
  net::io_context io;
  ServerOptions options;
  options.body_timeout = milliseconds(5000);
  options.buffered_body_deadline = milliseconds(500);
  TestServer ts(io, ApiRouter(), options);
  int fd = ConnectRaw(ts.server().port());
  const std::string header = "POST /api/v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
  ASSERT_GT(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 0);
  std::string answer;
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(4000);
  while (answer.empty() && std::chrono::steady_clock::now() < give_up) {
    ::send(fd, " ", 1, MSG_NOSIGNAL);  // 20 bytes a second: every gap far inside body_timeout
    answer = AnswerWithin(fd, milliseconds(50));
  }
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 504")) << "a body trickled for 4 s was not cut at 500 ms: " << answer;
  EXPECT_NE(answer.find("not complete within 500 ms"), std::string::npos) << answer;
}

TEST(ServerLimitsTest, FailedAuthorizeIsAnsweredBeforeTheBodyIsRead) {
  std::atomic<int> handled{0};
  std::atomic<size_t> body_size{0};
  Router router;
  auto authorize = [](const Request& req) -> Status {
    if (req.Header("authorization") != "Bearer good") return UnauthenticatedError("missing or wrong bearer token");
    return Status::Ok();
  };
  ASSERT_TRUE(router
                  .Add(
                      Method::kPost, "/api/v1/things",
                      [&](Request& req) -> Awaitable<Response> {
                        ++handled;
                        body_size = req.body.size();
                        co_return Response::NoContent();
                      },
                      RouteOptions{.max_body_bytes = 2 << 20, .authorize = authorize})
                  .ok());
  net::io_context io;
  ServerOptions options;
  options.body_timeout = milliseconds(5000);  // without the check first, the server would wait this long for the body
  TestServer ts(io, std::move(router), options);
  const std::string header = "POST /api/v1/things HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n";
  // Only the header is sent: the answer must come without the 1 MiB body.
  int fd = ConnectRaw(ts.server().port());
  std::string unauthenticated = header + "\r\n";
  ASSERT_GT(::send(fd, unauthenticated.data(), unauthenticated.size(), MSG_NOSIGNAL), 0);
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 4000), 1) << "no answer before the body was sent";
  std::string answer = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
  EXPECT_NE(answer.find("missing or wrong bearer token"), std::string::npos) << answer;
  EXPECT_EQ(handled, 0);

  // With the credentials, the body is read and handled.
  fd = ConnectRaw(ts.server().port());
  std::string good = header + "Authorization: Bearer good\r\nConnection: close\r\n\r\n" + std::string(1 << 20, 'x');
  ASSERT_EQ(::send(fd, good.data(), good.size(), MSG_NOSIGNAL), static_cast<ssize_t>(good.size()));
  answer = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 204")) << answer;
  EXPECT_EQ(handled, 1);
  EXPECT_EQ(body_size, size_t{1} << 20);
}

// Collects the default logger's messages while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int Count(std::string_view text) const {
    int n = 0;
    for (const std::string& line : sink_->last_formatted()) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// Out of descriptors, the server takes each waiting connection with the descriptor it keeps spare, answers it 503 with
// what to do, and logs the condition once a minute, not once per failed accept; once descriptors are back it serves.
TEST(ServerLimitsTest, OutOfFileDescriptorsRefusesWith503LogsOnceAndRecovers) {
  net::io_context io;
  TestServer ts(io, ApiRouter());
  LogCapture logs;
  // Sockets made before the limit drops can still connect; the server's accept cannot get a descriptor (EMFILE).
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(::socket(AF_INET, SOCK_STREAM, 0));
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(ts.server().port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int fd : clients) EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  // Each queued connection was refused clearly while descriptors were short (or, if it came after, served).
  int refused = 0;
  for (int fd : clients) {
    ::send(fd, kGetOne.data(), kGetOne.size(), MSG_NOSIGNAL);
    std::string answer = test_support::ReadUntilClosed(fd);
    ::close(fd);
    if (answer.starts_with("HTTP/1.1 503")) {
      ++refused;
      EXPECT_NE(answer.find("out of file descriptors"), std::string::npos) << answer;
    } else {
      EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer;
    }
  }
  EXPECT_GE(refused, 1);
  const int logged = logs.Count("out of file descriptors");
  EXPECT_GE(logged, 1);
  // Without the rate limit every failed accept would log a line.
  EXPECT_LE(logged, 2) << "running out of descriptors logged more than once a minute";
  EXPECT_EQ(Client(FastClient(ts.url())).Get("/api/v1/training-jobs/4")->status, 200);
}

TEST(ServerTest, GracefulShutdownFinishesInFlightRequestAndClosesStreams) {
  net::io_context io;
  Feed feed(io);
  std::promise<void> slow_started;
  Router router = FeedRouter(feed);
  ASSERT_TRUE(router
                  .Add(Method::kGet, "/slow",
                       [&](Request&) -> Awaitable<Response> {
                         slow_started.set_value();
                         net::steady_timer timer(co_await net::this_coro::executor, milliseconds(300));
                         co_await timer.async_wait(net::use_awaitable);
                         co_return Response::Text(200, "finished");
                       })
                  .ok());
  TestServer ts(io, std::move(router));
  Client client(FastClient(ts.url()));

  Status stream_status;
  std::promise<void> stream_open;
  std::thread watcher([&] {
    stream_status = client.ReadEvents("/events", [&](const SseEvent&) {
      stream_open.set_value();
      return true;
    });
  });
  ts.RunOnLoop([&] {
    feed.items.push_back("hello");
    feed.changed.Notify();
  });
  stream_open.get_future().wait();

  StatusOr<ClientResponse> slow = InternalError("not run");
  std::thread caller([&] { slow = client.Get("/slow", CallOptions{.retry = false}); });
  slow_started.get_future().wait();
  ts.Stop(milliseconds(5000));
  caller.join();
  watcher.join();

  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  EXPECT_EQ(slow->body, "finished");
  EXPECT_TRUE(stream_status.ok()) << stream_status.ToString();  // closed by the server with a final chunk
  auto after = client.Get("/poll?timeout_ms=1", CallOptions{.retry = false});
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
}

// --- Bodies received on another thread (BodyReader::TakeDirect) ---

// What a DirectBody reader thread saw: bytes, their sha256, its error, and whether it ran off the loop thread.
struct DirectRead {
  uint64_t bytes = 0;
  std::string sha256;
  Status error;
  bool off_loop = false;
};

// Reads `body` to its end on a new thread (as the coordinator's upload pool does) while the loop keeps running.
Awaitable<DirectRead> ReadDirectOnThread(std::shared_ptr<DirectBody> body) {
  auto result = std::make_shared<DirectRead>();
  auto done = std::make_shared<std::atomic<bool>>(false);
  const std::thread::id loop = std::this_thread::get_id();
  std::thread reader([body, result, done, loop] {
    result->off_loop = std::this_thread::get_id() != loop;
    EVP_MD_CTX* sha = EVP_MD_CTX_new();
    EVP_DigestInit_ex(sha, EVP_sha256(), nullptr);
    std::vector<char> buffer(1 << 20);
    while (true) {
      StatusOr<size_t> n = body->Read(buffer);
      if (!n.ok()) {
        result->error = n.status();
        break;
      }
      if (*n == 0) break;
      result->bytes += *n;
      EVP_DigestUpdate(sha, buffer.data(), *n);
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(sha, digest, &size);
    EVP_MD_CTX_free(sha);
    result->sha256 = Hex(digest, size);
    done->store(true);
  });
  net::steady_timer timer(co_await net::this_coro::executor);
  while (!done->load()) {
    timer.expires_after(milliseconds(2));
    co_await timer.async_wait(net::use_awaitable);
  }
  reader.join();
  co_return *result;
}

// PUT /direct/{name}: the body is read on another thread when the server allows it; the answer says how it went.
Router DirectRouter(std::promise<Status>* error_seen = nullptr,
                    RouteOptions options = {.stream_body = true, .max_body_bytes = 64 << 20}) {
  Router router;
  EXPECT_TRUE(
      router
          .Add(
              Method::kPut, "/direct/{name}",
              [error_seen](Request& req) -> Awaitable<Response> {
                std::shared_ptr<DirectBody> direct = req.body_stream->TakeDirect();
                if (!direct) co_return Response::Json(200, {{"direct", false}});
                EXPECT_EQ(req.body_stream->TakeDirect(), nullptr);  // handed out once
                DirectRead read = co_await ReadDirectOnThread(direct);
                if (!read.error.ok()) {
                  if (error_seen != nullptr) error_seen->set_value(read.error);
                  co_return Response::Error(read.error);
                }
                co_return Response::Json(
                    201,
                    {{"direct", true}, {"bytes", read.bytes}, {"sha256", read.sha256}, {"off_loop", read.off_loop}});
              },
              options)
          .ok());
  EXPECT_TRUE(router.Add(Method::kGet, "/after", Named("served after the body")).ok());
  return router;
}

TEST(ServerDirectBodyTest, BodyIsReceivedOffTheLoopAndTheConnectionServesTheNextRequest) {
  uint64_t counted = 0;
  ServerOptions options;
  options.on_request = [&counted](const RequestRecord& r) {
    if (r.request.route == "/direct/{name}") counted = r.bytes_received;
  };
  net::io_context io;
  TestServer ts(io, DirectRouter(), options);

  std::string blob(3 << 20, '\0');
  std::mt19937 rng(11);
  for (char& c : blob) c = static_cast<char>(rng());
  // The body and a pipelined second request in one send: the server must stop at Content-Length exactly.
  const std::string both = "PUT /direct/a HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(blob.size()) +
                           "\r\n\r\n" + blob + "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  int fd = ConnectRaw(ts.server().port());
  size_t sent = 0;
  while (sent < both.size()) {
    ssize_t n = ::send(fd, both.data() + sent, both.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
  std::string received = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 201")) << received.substr(0, 300);
  EXPECT_NE(received.find("\"direct\":true"), std::string::npos) << received.substr(0, 300);
  EXPECT_NE(received.find("\"bytes\":" + std::to_string(blob.size())), std::string::npos) << received.substr(0, 300);
  EXPECT_NE(received.find("\"sha256\":\"" + Sha256Hex(blob) + "\""), std::string::npos) << received.substr(0, 300);
  EXPECT_NE(received.find("\"off_loop\":true"), std::string::npos);
  EXPECT_NE(received.find("served after the body"), std::string::npos) << received.substr(0, 600);
  ts.RunOnLoop([] {});
  EXPECT_EQ(counted, blob.size());

  // Through the client (keep-alive, several uploads on one connection).
  Client client(FastClient(ts.url()));
  for (int i = 0; i < 3; ++i) {
    auto r = client.Send(Method::kPut, "/direct/b", blob.substr(0, 100'000 * (i + 1)), "application/octet-stream");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r->Json())["bytes"], 100'000 * (i + 1));
  }
}

TEST(ServerDirectBodyTest, ChunkedBodiesAndBodiesAlreadyBeingReadAreNotDirect) {
  net::io_context io;
  TestServer ts(io, DirectRouter());
  const std::string chunked =
      "PUT /direct/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: "
      "close\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
  std::string answer = Exchange(ts.server().port(), "127.0.0.1", chunked);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer;
  EXPECT_NE(answer.find("\"direct\":false"), std::string::npos) << answer;
}

TEST(ServerDirectBodyTest, ShutdownWakesAReaderWaitingForTheBody) {
  std::promise<Status> seen;
  ServerOptions options;
  options.body_timeout = milliseconds(60'000);  // only the shutdown can end the wait in time
  net::io_context io;
  TestServer ts(io, DirectRouter(&seen), options);
  int fd = ConnectRaw(ts.server().port());
  std::string partial = "PUT /direct/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b";
  ASSERT_EQ(::send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  ts.RunOnLoop([] {});
  std::this_thread::sleep_for(milliseconds(100));  // the reader is waiting in poll()
  const auto start = std::chrono::steady_clock::now();
  ts.Stop(milliseconds(200));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  auto status = seen.get_future();
  ASSERT_EQ(status.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(status.get().code(), StatusCode::kUnavailable);
  ::close(fd);
}

// --- Streamed bodies, read with Next() on the loop or with TakeDirect() on another thread: the same limits ---

enum class BodyReading { kNext, kDirect };

std::string BodyReadingName(const ::testing::TestParamInfo<BodyReading>& info) {
  return info.param == BodyReading::kNext ? "Next" : "TakeDirect";
}

// PUT /blobs/{key...}: reads the body the parameter's way and answers 201 {"size": bytes}, or the read's error, which
// also goes to `error_seen` (once).
Router StreamedBodyRouter(BodyReading reading, std::promise<Status>& error_seen, BodyRate rate = {}) {
  auto reported = std::make_shared<std::atomic<bool>>(false);
  Router router;
  EXPECT_TRUE(router
                  .Add(
                      Method::kPut, "/blobs/{key...}",
                      [reading, &error_seen, reported](Request& req) -> Awaitable<Response> {
                        Status error;
                        uint64_t total = 0;
                        if (reading == BodyReading::kDirect) {
                          std::shared_ptr<DirectBody> direct = req.body_stream->TakeDirect();
                          EXPECT_NE(direct, nullptr) << "a Content-Length body on plain TCP is handed out direct";
                          if (!direct) co_return Response::Error(InternalError("not direct"));
                          DirectRead read = co_await ReadDirectOnThread(direct);
                          error = read.error;
                          total = read.bytes;
                        } else {
                          while (true) {
                            StatusOr<std::string_view> chunk = co_await req.body_stream->Next();
                            if (!chunk.ok()) error = chunk.status();
                            if (!chunk.ok() || chunk->empty()) break;
                            total += chunk->size();
                          }
                        }
                        if (!error.ok()) {
                          if (!reported->exchange(true)) error_seen.set_value(error);
                          co_return Response::Error(error);
                        }
                        co_return Response::Json(201, {{"size", total}});
                      },
                      RouteOptions{.stream_body = true, .min_body_rate = rate})
                  .ok());
  return router;
}

class StreamedBodyTest : public ::testing::TestWithParam<BodyReading> {};

INSTANTIATE_TEST_SUITE_P(ReadOnTheLoopOrDirect, StreamedBodyTest,
                         ::testing::Values(BodyReading::kNext, BodyReading::kDirect), BodyReadingName);

TEST_P(StreamedBodyTest, StalledBodyFailsWithDeadlineExceededAndCloses) {
  std::promise<Status> seen;
  net::io_context io;
  ServerOptions options;
  options.body_timeout = milliseconds(200);
  TestServer ts(io, StreamedBodyRouter(GetParam(), seen), options);
  int fd = ConnectRaw(ts.server().port());
  std::string partial = "PUT /blobs/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b";
  ASSERT_EQ(::send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  // A stalled client cannot be trusted to read an answer either: the connection is simply closed.
  EXPECT_TRUE(PeerClosesWithin(fd, milliseconds(5000)));
  ::close(fd);
  auto status = seen.get_future();
  ASSERT_EQ(status.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status s = status.get();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "request body stalled for more than 200 ms");
}

TEST_P(StreamedBodyTest, BodyBelowTheMinimumRateIsCutWithAClearError) {
  std::promise<Status> seen;
  net::io_context io;
  TestServer ts(
      io, StreamedBodyRouter(GetParam(), seen,
                             {.bytes_per_second = 100'000, .window = milliseconds(300), .grace = milliseconds(1000)}));

  // A fast body passes.
  std::string fast = "PUT /blobs/a HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\nConnection: close\r\n\r\n" +
                     std::string(200'000, 'x');
  std::string answer = Exchange(ts.server().port(), "127.0.0.1", fast);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 201")) << answer;
  EXPECT_NE(answer.find("\"size\":200000"), std::string::npos) << answer;

  // 100 bytes every 20 ms (~5 KB/s) is far under 100 KB/s: cut after the grace and a window, with an answer.
  const std::string header = "PUT /blobs/a HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n";
  int fd = ConnectRaw(ts.server().port());
  ASSERT_GT(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 0);
  bool answered = false;
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(15'000);
  while (!answered && std::chrono::steady_clock::now() < give_up) {
    ::send(fd, std::string(100, 'x').data(), 100, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    answered = ::poll(&p, 1, 20) > 0;
  }
  ASSERT_TRUE(answered) << "a body at 5 KB/s was not cut within 15 s";
  std::string cut = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_TRUE(cut.starts_with("HTTP/1.1 504")) << cut;
  EXPECT_NE(cut.find("below the minimum of 100000 bytes/s"), std::string::npos) << cut;
  auto status = seen.get_future();
  ASSERT_EQ(status.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(status.get().code(), StatusCode::kDeadlineExceeded);
}

TEST(ServerTest, RejectsBadListenAddressAndTlsFiles) {
  net::io_context io;
  ServerOptions bad_host;
  bad_host.listen = "not-an-ip:80";
  EXPECT_EQ(Server::Start(io, bad_host, Router()).status().code(), StatusCode::kInvalidArgument);
  ServerOptions bad_port;
  bad_port.listen = "127.0.0.1:99999";
  EXPECT_EQ(Server::Start(io, bad_port, Router()).status().code(), StatusCode::kInvalidArgument);
  ServerOptions half_tls;
  half_tls.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(Server::Start(io, half_tls, Router()).status().code(), StatusCode::kInvalidArgument);
  ServerOptions missing_tls = half_tls;
  missing_tls.tls_key_file = "/nonexistent/key.pem";
  auto s = Server::Start(io, missing_tls, Router());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("/nonexistent/cert.pem"), std::string::npos);
}

TEST(ServerTest, TlsRoundTrip) {
  TempDir dir;
  std::filesystem::path cert = dir.path() / "cert.pem";
  std::filesystem::path key = dir.path() / "key.pem";
  std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " +
      key.string() + " -out " + cert.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << "the test needs the openssl command";

  net::io_context io;
  ServerOptions options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  TestServer ts(io, ApiRouter(), options);
  ASSERT_TRUE(ts.server().tls());
  ClientOptions client_options = FastClient(ts.url());
  client_options.ca_file = cert;
  Client client(client_options);
  auto r = client.Get("/api/v1/training-jobs/9");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r->Json())["id"], "9");
  auto echo = client.PostJson("/api/v1/echo", {{"over", "tls"}});
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();

  // Without the CA the certificate is not trusted.
  ClientOptions untrusting = FastClient(ts.url());
  untrusting.max_attempts = 1;
  auto refused = Client(untrusting).Get("/api/v1/training-jobs/9");
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
}

TEST(ServerTest, LoopbackListenAddresses) {
  for (const char* loopback : {"127.0.0.1:8080", "127.1.2.3:0", "localhost:80", "[::1]:8080", "[::ffff:127.0.0.1]:1"}) {
    StatusOr<bool> is = IsLoopbackListenAddress(loopback);
    ASSERT_TRUE(is.ok()) << loopback << ": " << is.status().ToString();
    EXPECT_TRUE(*is) << loopback;
  }
  for (const char* open : {"0.0.0.0:8080", ":8080", "[::]:8080", "10.0.0.5:8080", "[2001:db8::1]:443"}) {
    StatusOr<bool> is = IsLoopbackListenAddress(open);
    ASSERT_TRUE(is.ok()) << open << ": " << is.status().ToString();
    EXPECT_FALSE(*is) << open;
  }
  EXPECT_EQ(IsLoopbackListenAddress("no-port").status().code(), StatusCode::kInvalidArgument);
}

// Runs an openssl command line (the test's PKI); fails the test when it fails.
void OpenSsl(const std::string& args) {
  const std::string command = "openssl " + args + " 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << "the test needs the openssl command: " << command;
}

// A CA, and `leaf` signed by it (its key leaf.key, certificate leaf.pem) with the given subject and extensions.
void MakeCa(const std::filesystem::path& dir, const std::string& name) {
  OpenSsl("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=" + name +
          " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign -keyout " +
          (dir / (name + ".key")).string() + " -out " + (dir / (name + ".pem")).string());
}
void MakeLeaf(const std::filesystem::path& dir, const std::string& ca, const std::string& leaf,
              const std::string& subject, const std::string& extensions) {
  const std::string base = (dir / leaf).string();
  const std::string ext_file = base + ".ext";
  std::ofstream(ext_file) << extensions << "\n";
  OpenSsl("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj " + subject + " -keyout " + base +
          ".key -out " + base + ".csr");
  OpenSsl("x509 -req -in " + base + ".csr -CA " + (dir / (ca + ".pem")).string() + " -CAkey " +
          (dir / (ca + ".key")).string() + " -CAcreateserial -days 1 -extfile " + ext_file + " -out " + base + ".pem");
}

// With a client CA the server asks for a certificate and hands its verified identity to the handler; a client
// without one is still served (routes decide), and a certificate from another CA fails the handshake.
TEST(ServerTest, ClientCertificatesAreVerifiedAndTheirIdentityReachesTheHandler) {
  TempDir dir;
  const std::filesystem::path d = dir.path();
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "ca"));
  ASSERT_NO_FATAL_FAILURE(MakeCa(d, "other-ca"));
  ASSERT_NO_FATAL_FAILURE(MakeLeaf(d, "ca", "server", "/CN=server", "subjectAltName=IP:127.0.0.1"));
  ASSERT_NO_FATAL_FAILURE(MakeLeaf(d, "ca", "worker-7", "/O=parsyn/CN=worker-7", "extendedKeyUsage=clientAuth"));
  ASSERT_NO_FATAL_FAILURE(
      MakeLeaf(d, "ca", "san-only", "/O=parsyn", "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:worker-9"));
  ASSERT_NO_FATAL_FAILURE(MakeLeaf(d, "other-ca", "forged", "/CN=worker-7", "extendedKeyUsage=clientAuth"));

  Router router;
  ASSERT_TRUE(router
                  .Add(Method::kGet, "/whoami",
                       [](Request& req) -> Awaitable<Response> {
                         co_return Response::Json(
                             200, {{"identity", req.client_identity ? nlohmann::json(*req.client_identity) : nullptr}});
                       })
                  .ok());
  net::io_context io;
  ServerOptions options;
  options.tls_cert_file = d / "server.pem";
  options.tls_key_file = d / "server.key";
  options.tls_client_ca = d / "ca.pem";
  TestServer ts(io, std::move(router), options);
  ASSERT_TRUE(ts.server().verifies_client_certificates());
  auto whoami = [&](const std::string& leaf) -> StatusOr<nlohmann::json> {
    ClientOptions o = FastClient(ts.url());
    o.max_attempts = 1;
    o.ca_file = d / "ca.pem";
    if (!leaf.empty()) {
      o.client_cert_file = d / (leaf + ".pem");
      o.client_key_file = d / (leaf + ".key");
    }
    PARSYN_ASSIGN_OR_RETURN(ClientResponse r, Client(o).Get("/whoami"));
    return r.Json();
  };

  StatusOr<nlohmann::json> worker = whoami("worker-7");
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ((*worker)["identity"], "worker-7");
  StatusOr<nlohmann::json> san = whoami("san-only");
  ASSERT_TRUE(san.ok()) << san.status().ToString();
  EXPECT_EQ((*san)["identity"], "worker-9");
  StatusOr<nlohmann::json> anonymous = whoami("");
  ASSERT_TRUE(anonymous.ok()) << anonymous.status().ToString();
  EXPECT_TRUE((*anonymous)["identity"].is_null()) << anonymous->dump();
  StatusOr<nlohmann::json> forged = whoami("forged");
  EXPECT_EQ(forged.status().code(), StatusCode::kUnavailable) << forged.status().ToString();

  // The same certificate means nothing to a server without a client CA.
  net::io_context plain_io;
  ServerOptions no_ca = options;
  no_ca.tls_client_ca.clear();
  Router echo;
  ASSERT_TRUE(echo.Add(Method::kGet, "/whoami",
                       [](Request& req) -> Awaitable<Response> {
                         co_return Response::Json(200, {{"has_identity", req.client_identity.has_value()}});
                       })
                  .ok());
  TestServer plain(plain_io, std::move(echo), no_ca);
  ClientOptions o = FastClient(plain.url());
  o.ca_file = d / "ca.pem";
  o.client_cert_file = d / "worker-7.pem";
  o.client_key_file = d / "worker-7.key";
  auto r = Client(o).Get("/whoami");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r->Json())["has_identity"], false);
}

TEST(ServerTest, ClientCaNeedsTlsAndAReadableFile) {
  net::io_context io;
  ServerOptions no_tls;
  no_tls.tls_client_ca = "/nonexistent/ca.pem";
  auto s = Server::Start(io, no_tls, Router());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("needs TLS"), std::string::npos) << s.status().message();

  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(MakeCa(dir.path(), "ca"));
  ServerOptions missing_ca;
  missing_ca.tls_cert_file = dir.path() / "ca.pem";
  missing_ca.tls_key_file = dir.path() / "ca.key";
  missing_ca.tls_client_ca = dir.path() / "missing.pem";
  s = Server::Start(io, missing_ca, Router());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("missing.pem"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace parsyn::http
