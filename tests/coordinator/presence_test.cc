// Worker presence at scale: heartbeats are kept in memory and reach the store in batches (N heartbeats cost O(1)
// commits, not N), and presence is rebuilt after a restart from the workers' new hellos. The coordinator runs in this
// process (a real Service, HTTP server and SQLite store) so that the test can count the store's commits.
#include <gtest/gtest.h>

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
  void FlushPresence() { boost::asio::co_spawn(io_, service_->FlushPresence(), boost::asio::use_future).get(); }
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
    // Less 1 ms: the coordinator dates a heartbeat from its steady clock (unix_now - age), truncated to the ms.
    seen_after_ms = SystemClock::Get().UnixMillis() - 1;
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
    }
    coordinator.FlushPresence();  // nobody seen since: nothing to write
    EXPECT_EQ(coordinator.commits() - before, 1);
    seen_after_ms = SystemClock::Get().UnixMillis() - 1;
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_TRUE(workers[i]->PostJson("/api/v1/worker/heartbeat", {{"session_id", sessions[i]}}).ok());
    }
  }  // shutdown stores the presence seen since the last flush

  // A restart (sessions do not survive one): every worker is offline until it says hello again, with the last
  // heartbeat the shutdown stored; a hello makes it online again.
  InProcessCoordinator restarted(options);
  ASSERT_TRUE(restarted.ok());
  auto admin = restarted.Client(admin_key);
  for (int64_t id : ids) {
    json record = WorkerRecord(*admin, id);
    EXPECT_EQ(record["status"], "offline");
    EXPECT_GE(record["last_heartbeat_at_ms"].get<int64_t>(), seen_after_ms);
  }
  auto first = restarted.Client(tokens[0]);
  auto stale = first->PostJson("/api/v1/worker/heartbeat", {{"session_id", "pss_from_before_the_restart"}});
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition) << stale.status().ToString();  // "send hello again"
  SessionOf(*first);
  EXPECT_EQ(WorkerRecord(*admin, ids[0])["status"], "online");
  EXPECT_EQ(WorkerRecord(*admin, ids[1])["status"], "offline");
}

}  // namespace
}  // namespace parsyn::testing
