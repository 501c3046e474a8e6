// Worker presence at scale: heartbeats are kept in memory and reach the store in batches (N heartbeats cost O(1)
// commits, not N), presence is rebuilt after a restart from the workers' new hellos, and an idle worker's open
// long-poll is its presence (no heartbeats needed: one connection per idle worker). The coordinator runs in this
// process (a real Service, HTTP server and SQLite store) so that the test can count the store's commits.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "coordinator/service.h"
#include "harness.h"
#include "http/test_server.h"
#include "storage/sqlite_store.h"
#include "storage/timed_metadata_store.h"

namespace parsyn::testing {
namespace {

// A Service behind a real HTTP server on 127.0.0.1, its loop on a thread of its own.
class InProcessCoordinator {
 public:
  explicit InProcessCoordinator(coordinator::ServiceOptions options) {
    auto service = coordinator::Service::Open(io_, std::move(options));
    if (!service.ok()) {
      ADD_FAILURE() << service.status().ToString();
      return;
    }
    service_ = std::move(service).value();
    auto router = service_->BuildRouter();
    if (!router.ok()) {
      ADD_FAILURE() << router.status().ToString();
      return;
    }
    server_ = std::make_unique<http::testing::TestServer>(io_, std::move(router).value());
    boost::asio::co_spawn(io_, service_->Start(), boost::asio::use_future).get();
  }
  ~InProcessCoordinator() {
    if (server_ == nullptr) return;
    server_->RunOnLoop([this] { service_->BeginShutdown(); });
    server_.reset();  // stops the server and the loop; then ~Service stores the last presence
  }

  bool ok() const { return server_ != nullptr; }
  coordinator::Service& service() { return *service_; }
  // The service wraps its store to time every call (/metrics); the commits are the SQLite store's inside.
  int64_t commits() {
    auto& timed = dynamic_cast<storage::TimedMetadataStore&>(service_->store());
    return dynamic_cast<storage::SqliteMetadataStore&>(timed.inner()).commits();
  }
  uint16_t port() const {
    return static_cast<uint16_t>(std::stoi(server_->url().substr(server_->url().rfind(':') + 1)));
  }
  void FlushPresence() {
    boost::asio::co_spawn(io_, service_->sessions().FlushPresence(), boost::asio::use_future).get();
  }
  template <typename Fn>
  void RunOnLoop(Fn fn) {
    server_->RunOnLoop(std::move(fn));
  }
  std::unique_ptr<http::Client> Client(const std::string& token) {
    http::ClientOptions options;
    options.base_url = server_->url();
    options.bearer_token = token;
    options.max_attempts = 1;
    return std::make_unique<http::Client>(options);
  }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<coordinator::Service> service_;
  std::unique_ptr<http::testing::TestServer> server_;  // after service_: stopped before the service goes
};

std::string SessionOf(http::Client& worker) {
  auto hello = worker.PostJson("/api/v1/worker/hello", {{"device", "cpu (test)"}});
  EXPECT_TRUE(hello.ok() && hello->status == 200) << (hello.ok() ? hello->body : hello.status().ToString());
  return hello.ok() && hello->status == 200 ? (*hello->Json())["session_id"].get<std::string>() : "";
}

json WorkerRecord(http::Client& admin, int64_t id) {
  auto got = admin.Get("/api/v1/workers/" + std::to_string(id));
  EXPECT_TRUE(got.ok() && got->status == 200);
  return got.ok() ? *got->Json() : json();
}

TEST(PresenceTest, HeartbeatsAreStoredInBatchesAndPresenceIsRebuiltAfterARestart) {
  constexpr int kWorkers = 20;
  constexpr int kBeats = 10;
  TempDir dir;
  coordinator::ServiceOptions options;
  options.data_dir = dir.path() / "data";
  options.presence_flush_interval = std::chrono::hours(1);  // flushed by the test, then at shutdown
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
  std::string admin_key;
  int64_t seen_after_ms = 0;
  std::vector<int64_t> flushed_ms;  // each worker's last heartbeat as the explicit flush stored it
  constexpr std::chrono::milliseconds kGap(100);
  {
    InProcessCoordinator coordinator(options);
    ASSERT_TRUE(coordinator.ok());
    admin_key = *coordinator.service().new_admin_key();
    auto admin = coordinator.Client(admin_key);
    std::vector<std::unique_ptr<http::Client>> workers;
    std::vector<std::string> sessions;
    for (int i = 0; i < kWorkers; ++i) {
      auto created = admin->PostJson("/api/v1/workers", {{"name", "w" + std::to_string(i)}, {"kind", "own"}});
      ASSERT_TRUE(created.ok() && created->status == 201);
      ids.push_back((*created->Json())["id"]);
      tokens.push_back((*created->Json())["token"]);
      workers.push_back(coordinator.Client(tokens.back()));
      sessions.push_back(SessionOf(*workers.back()));
    }
    // The coordinator dates a heartbeat from two clocks (unix_now - steady age), so the wall clock's steps show in
    // it (a CI run saw 5 ms): the heartbeats come kGap after the hellos, and are dated within half of it.
    std::this_thread::sleep_for(kGap);
    seen_after_ms = SystemClock::Get().UnixMillis() - kGap.count() / 2;
    const int64_t before = coordinator.commits();
    for (int beat = 0; beat < kBeats; ++beat) {
      for (int i = 0; i < kWorkers; ++i) {
        auto answer = workers[i]->PostJson("/api/v1/worker/heartbeat", {{"session_id", sessions[i]}});
        ASSERT_TRUE(answer.ok() && answer->status == 200);
      }
    }
    // kWorkers * kBeats heartbeats, no status change: nothing reached the store yet...
    EXPECT_EQ(coordinator.commits() - before, 0);
    // ...while the API shows each worker's last heartbeat from memory.
    for (int64_t id : ids) EXPECT_GE(WorkerRecord(*admin, id)["last_heartbeat_at_ms"].get<int64_t>(), seen_after_ms);
    // One flush stores all of them in one commit.
    coordinator.FlushPresence();
    EXPECT_EQ(coordinator.commits() - before, 1);
    for (int64_t id : ids) {
      StatusOr<storage::Worker> stored = coordinator.service().store().GetWorker(id);
      ASSERT_TRUE(stored.ok());
      EXPECT_GE(stored->last_heartbeat_at_ms.value_or(0), seen_after_ms);
      EXPECT_EQ(stored->status, storage::WorkerStatus::kOnline);
      flushed_ms.push_back(stored->last_heartbeat_at_ms.value_or(0));
    }
    coordinator.FlushPresence();  // nobody seen since: nothing to write
    EXPECT_EQ(coordinator.commits() - before, 1);
    // The last heartbeats come kGap after the flushed ones: the shutdown's write shows despite a step.
    std::this_thread::sleep_for(kGap);
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_TRUE(workers[i]->PostJson("/api/v1/worker/heartbeat", {{"session_id", sessions[i]}}).ok());
    }
  }  // shutdown stores the presence seen since the last flush

  // A restart (sessions do not survive one): every worker is offline until it says hello again, with the last
  // heartbeat the shutdown stored; a hello makes it online again.
  InProcessCoordinator restarted(options);
  ASSERT_TRUE(restarted.ok());
  auto admin = restarted.Client(admin_key);
  for (size_t i = 0; i < ids.size(); ++i) {
    json record = WorkerRecord(*admin, ids[i]);
    EXPECT_EQ(record["status"], "offline");
    EXPECT_GE(record["last_heartbeat_at_ms"].get<int64_t>(), flushed_ms[i] + kGap.count() / 2) << "worker " << i;
  }
  auto first = restarted.Client(tokens[0]);
  auto stale = first->PostJson("/api/v1/worker/heartbeat", {{"session_id", "pss_from_before_the_restart"}});
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition) << stale.status().ToString();  // "send hello again"
  SessionOf(*first);
  EXPECT_EQ(WorkerRecord(*admin, ids[0])["status"], "online");
  EXPECT_EQ(WorkerRecord(*admin, ids[1])["status"], "offline");
}

// A connected worker's busy/online (two changes per task) is presence: shown by the API and the event stream from
// the session, never a commit each (at 10,000 workers that was 20,000 commits a round).
TEST(PresenceTest, BusyAndOnlineOfAConnectedWorkerCostNoCommit) {
  TempDir dir;
  coordinator::ServiceOptions options;
  options.data_dir = dir.path() / "data";
  options.presence_flush_interval = std::chrono::hours(1);
  InProcessCoordinator coordinator(options);
  ASSERT_TRUE(coordinator.ok());
  auto admin = coordinator.Client(*coordinator.service().new_admin_key());
  auto created = admin->PostJson("/api/v1/workers", {{"name", "w"}, {"kind", "own"}});
  ASSERT_TRUE(created.ok() && created->status == 201);
  const int64_t id = (*created->Json())["id"];
  auto worker = coordinator.Client((*created->Json())["token"]);
  const std::string session = SessionOf(*worker);
  EXPECT_EQ(WorkerRecord(*admin, id)["status"], "online");
  const int64_t before = coordinator.commits();
  for (int task = 0; task < 3; ++task) {
    coordinator.RunOnLoop(
        [&] { EXPECT_TRUE(coordinator.service().DeliverTask(id, 7, {.round = task, .json = "{}"})); });
    EXPECT_EQ(WorkerRecord(*admin, id)["status"], "busy");
    EXPECT_EQ(WorkerRecord(*admin, id)["current_job_id"], 7);
    auto polled = worker->Get("/api/v1/worker/tasks/next?session_id=" + session + "&wait_ms=0");
    ASSERT_TRUE(polled.ok() && polled->status == 200) << (polled.ok() ? polled->body : polled.status().ToString());
    coordinator.RunOnLoop([&] { coordinator.service().TaskFinished(id, 7); });
    coordinator.RunOnLoop([] {});  // the status change TaskFinished spawned on the loop has run
    EXPECT_EQ(WorkerRecord(*admin, id)["status"], "online");
  }
  EXPECT_EQ(coordinator.commits() - before, 0);
  StatusOr<storage::Worker> stored = coordinator.service().store().GetWorker(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status, storage::WorkerStatus::kOnline);  // the store's word for a connected worker
}

// A task poll sent on a raw loopback socket, so that the test can drop the connection mid-poll: the descriptor.
int SendPollOnRawSocket(uint16_t port, const std::string& token, const std::string& session, int wait_ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /api/v1/worker/tasks/next?session_id=" + session +
                              "&wait_ms=" + std::to_string(wait_ms) +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token + "\r\n\r\n";
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  return fd;
}

// An idle worker sends no heartbeats while its long-poll is open (one connection per worker): it stays online however
// long the polls last past the heartbeat timeout, and a heartbeat on a second connection (an older worker) is still
// taken. A worker whose connection is gone mid-poll goes offline once that poll would have ended plus the timeout.
TEST(PresenceTest, AnOpenPollKeepsAnIdleWorkerOnlineAndAVanishedOneGoesOffline) {
  TempDir dir;
  coordinator::ServiceOptions options;
  options.data_dir = dir.path() / "data";
  options.heartbeat_timeout = std::chrono::milliseconds(1000);
  options.max_poll_wait = std::chrono::milliseconds(2000);
  InProcessCoordinator coordinator(options);
  ASSERT_TRUE(coordinator.ok());
  auto admin = coordinator.Client(*coordinator.service().new_admin_key());
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
  for (const char* name : {"polling", "vanishing"}) {
    auto created = admin->PostJson("/api/v1/workers", {{"name", name}, {"kind", "own"}});
    ASSERT_TRUE(created.ok() && created->status == 201);
    ids.push_back((*created->Json())["id"]);
    tokens.push_back((*created->Json())["token"]);
  }
  auto polling = coordinator.Client(tokens[0]);
  auto polling_heartbeats = coordinator.Client(tokens[0]);  // a second connection, as an older worker holds
  auto vanishing = coordinator.Client(tokens[1]);
  const std::string polling_session = SessionOf(*polling);
  const std::string vanishing_session = SessionOf(*vanishing);

  // The vanishing worker opens a poll and drops its connection.
  const int fd = SendPollOnRawSocket(coordinator.port(), tokens[1], vanishing_session, 2000);
  ::close(fd);

  // Two polls of 2 s each (the server's longest), no heartbeat in between: each lasts twice the heartbeat timeout,
  // and the session survives both (a poll of an ended session answers 409, not 204).
  const std::string next = "/api/v1/worker/tasks/next?session_id=" + polling_session + "&wait_ms=2000";
  for (int poll = 0; poll < 2; ++poll) {
    auto answer = std::async(std::launch::async, [&] { return polling->Get(next); });
    if (poll == 1) {
      // An older worker's heartbeat on its other connection, during the poll, is still answered.
      auto beat = polling_heartbeats->PostJson("/api/v1/worker/heartbeat", {{"session_id", polling_session}});
      EXPECT_TRUE(beat.ok() && beat->status == 200) << (beat.ok() ? beat->body : beat.status().ToString());
      EXPECT_EQ(WorkerRecord(*admin, ids[0])["status"], "online");
    }
    StatusOr<http::ClientResponse> got = answer.get();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->status, 204);
  }

  // Its poll ended (or never started) 2 s after it was sent at the latest, and nothing came since: offline.
  std::string vanished_status;
  for (int i = 0; i < 300 && vanished_status != "offline"; ++i) {
    vanished_status = WorkerRecord(*admin, ids[1])["status"];
    if (vanished_status != "offline") std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(vanished_status, "offline");
}

}  // namespace
}  // namespace parsyn::testing
