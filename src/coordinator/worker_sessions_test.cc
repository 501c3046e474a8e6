// WorkerSessions on its own: an in-memory SQLite store, FakeClock, and the test's io_context run until each step's
// coroutine is done. No Service, no HTTP.
#include "coordinator/worker_sessions.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/sqlite_store.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using storage::WorkerStatus;

class WorkerSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = storage::SqliteMetadataStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    for (const char* name : {"w1", "w2", "w3"}) {
      auto created = store_->CreateWorker(
          {.name = name, .token_sha256 = std::string("hash-") + name, .created_at_ms = clock_.UnixMillis()});
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      ids_.push_back(created->id);
    }
    sessions_ = std::make_unique<WorkerSessions>(io_.get_executor(), clock_, *store_, pool_,
                                                 [this](int64_t worker_id, const json& fields) {
                                                   changes_.push_back(fields);
                                                   changes_.back()["id"] = worker_id;
                                                 });
  }

  // Runs `op` on the test's loop until it is done.
  void Await(http::Awaitable<void> op) {
    std::future<void> done = boost::asio::co_spawn(io_, std::move(op), boost::asio::use_future);
    while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      io_.restart();
      io_.run_for(std::chrono::milliseconds(5));
    }
    done.get();
  }

  // A hello's session, its "online" stored (as the worker protocol's hello does).
  WorkerSessions::Session& Hello(int64_t worker_id, protocol::Hello hello = {}) {
    WorkerSessions::Session& s = sessions_->Open(worker_id, "pss_" + std::to_string(worker_id), hello);
    Await(sessions_->SetWorkerStatus(worker_id, WorkerStatus::kOnline, "cpu"));
    return s;
  }

  storage::Worker Stored(int64_t worker_id) {
    auto w = store_->GetWorker(worker_id);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? *w : storage::Worker{};
  }

  static TaskMessage Task(int round, int attempt) {
    return {.round = round, .attempt = attempt, .json = R"({"round":)" + std::to_string(round) + "}"};
  }

  boost::asio::io_context io_;
  boost::asio::thread_pool pool_{1};
  FakeClock clock_;
  std::unique_ptr<storage::SqliteMetadataStore> store_;
  std::vector<int64_t> ids_;
  std::vector<json> changes_;
  std::unique_ptr<WorkerSessions> sessions_;
};

TEST_F(WorkerSessionsTest, QueuedTaskIsDeliveredAndADeliveredOneAbandonedInTheNextHeartbeat) {
  const int64_t w = ids_[0];
  WorkerSessions::Session& s = Hello(w);
  EXPECT_FALSE(sessions_->DeliverTask(ids_[1], 7, Task(1, 1)));  // no session: the worker went away

  ASSERT_TRUE(sessions_->DeliverTask(w, 7, Task(1, 1)));
  EXPECT_EQ(s.queued.size(), 1u);
  EXPECT_EQ(s.tasks_assigned, 1u);
  EXPECT_EQ(s.status, WorkerStatus::kBusy);
  // Busy is presence: noted for the dashboard, kept in the session, not written to the store.
  EXPECT_EQ(changes_.back()["status"], "busy");
  EXPECT_EQ(changes_.back()["current_job_id"], 7);
  EXPECT_EQ(Stored(w).status, WorkerStatus::kOnline);

  // Not yet delivered: abandoning removes it from the queue, and there is nothing to tell the worker.
  sessions_->AbandonTask(w, 7, 1, 1);
  EXPECT_TRUE(s.queued.empty());
  EXPECT_TRUE(s.abandon.empty());

  // Delivered (a poll took it): the next heartbeat's "abandon" names it.
  ASSERT_TRUE(sessions_->DeliverTask(w, 7, Task(1, 2)));
  ASSERT_TRUE(sessions_->HandOverQueuedTask(s).has_value());
  sessions_->AbandonTask(w, 7, 1, 1);  // another attempt: not the one it holds
  EXPECT_TRUE(s.abandon.empty());
  sessions_->AbandonTask(w, 7, 1, 2);
  ASSERT_EQ(s.abandon.size(), 1u);
  EXPECT_EQ(s.abandon[0].job_id, 7);
  EXPECT_EQ(s.abandon[0].round, 1);
  EXPECT_EQ(s.abandon[0].attempt, 2);
  EXPECT_FALSE(s.current_job.has_value());
}

TEST_F(WorkerSessionsTest, APollTakesTheQueuedTasksInOrderAndAPollWhileHoldingOneDropsIt) {
  const int64_t w = ids_[0];
  WorkerSessions::Session& s = Hello(w);
  clock_.Advance(std::chrono::seconds(5));
  sessions_->PollStarted(s);
  EXPECT_EQ(s.polls_in_flight, 1);
  EXPECT_EQ(s.last_seen, clock_.Now());
  EXPECT_EQ(sessions_->IdleWorkers(), std::vector<int64_t>{w});
  EXPECT_FALSE(sessions_->HandOverQueuedTask(s).has_value());  // nothing queued: the poll answers 204

  ASSERT_TRUE(sessions_->DeliverTask(w, 7, Task(3, 1)));
  ASSERT_TRUE(sessions_->DeliverTask(w, 8, Task(1, 2)));
  std::optional<std::string> first = sessions_->HandOverQueuedTask(s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, Task(3, 1).json);
  EXPECT_EQ(s.current_job, 7);
  EXPECT_EQ(s.current_round, 3);
  EXPECT_EQ(s.current_attempt, 1);
  sessions_->PollEnded(s);
  EXPECT_EQ(s.polls_in_flight, 0);

  // Polling again while holding job 7's task: the worker dropped it, and the next poll hands over job 8's.
  sessions_->PollStarted(s);
  EXPECT_FALSE(s.current_job.has_value());
  std::optional<std::string> second = sessions_->HandOverQueuedTask(s);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, Task(1, 2).json);
  EXPECT_EQ(s.current_job, 8);
  EXPECT_EQ(s.current_attempt, 2);
  EXPECT_TRUE(s.queued.empty());
}

// A task that ends without a report (its job stopped: abandoned, the result refused) leaves no TaskFinished, and a
// worker sends no heartbeat while its poll is open: its next poll makes it online again.
TEST_F(WorkerSessionsTest, APollAfterAnAbandonedTaskMakesTheWorkerOnlineAgain) {
  const int64_t w = ids_[0];
  WorkerSessions::Session& s = Hello(w);
  ASSERT_TRUE(sessions_->DeliverTask(w, 7, Task(9, 1)));
  ASSERT_TRUE(sessions_->HandOverQueuedTask(s).has_value());
  EXPECT_EQ(s.status, WorkerStatus::kBusy);
  sessions_->AbandonTask(w, 7, 9, 1);
  EXPECT_EQ(s.status, WorkerStatus::kBusy);  // it may still be running it until its next heartbeat or poll
  sessions_->PollStarted(s);
  EXPECT_EQ(s.status, WorkerStatus::kOnline);
  EXPECT_EQ(changes_.back()["status"], "online");
  const size_t changes = changes_.size();
  sessions_->PollEnded(s);
  sessions_->PollStarted(s);
  EXPECT_EQ(changes_.size(), changes) << "a poll of an online worker changes nothing for the dashboard";

  // A poll with a task already queued for it keeps it busy.
  sessions_->PollEnded(s);
  ASSERT_TRUE(sessions_->DeliverTask(w, 8, Task(1, 1)));
  sessions_->PollStarted(s);
  EXPECT_EQ(s.status, WorkerStatus::kBusy);
}

TEST_F(WorkerSessionsTest, FinishedTaskMakesTheWorkerIdleAgain) {
  const int64_t w = ids_[0];
  WorkerSessions::Session& s = Hello(w);
  s.polls_in_flight = 1;
  Hello(ids_[2]).polls_in_flight = 1;
  Hello(ids_[1]);  // no poll open: not idle
  EXPECT_EQ(sessions_->IdleWorkers(), (std::vector<int64_t>{ids_[0], ids_[2]}));

  ASSERT_TRUE(sessions_->DeliverTask(w, 3, Task(2, 1)));
  EXPECT_EQ(sessions_->IdleWorkers(), (std::vector<int64_t>{ids_[2]}));
  s.current_job = 3;
  s.queued.clear();
  sessions_->TaskFinished(w, 4);  // another job's: ignored
  EXPECT_TRUE(s.current_job.has_value());
  sessions_->TaskFinished(w, 3);
  EXPECT_FALSE(s.current_job.has_value());
  EXPECT_EQ(s.status, WorkerStatus::kOnline);
  EXPECT_EQ(sessions_->IdleWorkers(), (std::vector<int64_t>{ids_[0], ids_[2]}));
}

TEST_F(WorkerSessionsTest, HelloKeepsTrainersAndLocalDataAndStoresOnline) {
  const int64_t w = ids_[0];
  Hello(w);
  // No trainers named: the built-in one, for any model kind.
  EXPECT_TRUE(sessions_->WorkerOffersTrainer(w, protocol::kBuiltinTrainer, "mlp"));
  EXPECT_FALSE(sessions_->WorkerOffersTrainer(w, "other", "mlp"));
  EXPECT_FALSE(sessions_->WorkerOffersTrainer(ids_[1], protocol::kBuiltinTrainer, "mlp"));
  EXPECT_FALSE(sessions_->WorkerHasLocalData(w));

  const storage::Worker stored = Stored(w);
  EXPECT_EQ(stored.status, WorkerStatus::kOnline);
  EXPECT_EQ(stored.device, "cpu");
  EXPECT_EQ(stored.trainers_json, sessions_->Find(w)->trainers_json);
  EXPECT_EQ(stored.last_heartbeat_at_ms, clock_.UnixMillis());
  // The hello's change for the dashboard names the device and the trainers.
  EXPECT_EQ(changes_.back()["id"], w);
  EXPECT_EQ(changes_.back()["device"], "cpu");
  EXPECT_TRUE(changes_.back().contains("trainers"));

  protocol::Hello with_data;
  with_data.local_data = protocol::LocalData{};
  sessions_->Open(ids_[1], "pss_x", with_data);
  EXPECT_TRUE(sessions_->WorkerHasLocalData(ids_[1]));
}

TEST_F(WorkerSessionsTest, PresenceReachesTheStoreInOneFlush) {
  const int64_t w1 = ids_[0];
  const int64_t w2 = ids_[1];
  Hello(w1);
  Hello(w2);
  // The hellos stored the workers' presence with their status: nothing to flush.
  EXPECT_TRUE(sessions_->UnstoredPresence().empty());

  clock_.Advance(std::chrono::seconds(3));
  sessions_->Find(w1)->last_seen = clock_.Now();  // a heartbeat
  clock_.Advance(std::chrono::seconds(1));
  const std::vector<storage::WorkerSeen> seen = sessions_->UnstoredPresence();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].worker_id, w1);
  EXPECT_EQ(seen[0].last_heartbeat_at_ms, clock_.UnixMillis() - 1000);

  changes_.clear();
  Await(sessions_->FlushPresence());
  EXPECT_EQ(Stored(w1).last_heartbeat_at_ms, clock_.UnixMillis() - 1000);
  EXPECT_TRUE(sessions_->UnstoredPresence().empty());
  ASSERT_EQ(changes_.size(), 1u);
  EXPECT_EQ(changes_[0], (json{{"id", w1}, {"last_heartbeat_at_ms", clock_.UnixMillis() - 1000}}));
}

TEST_F(WorkerSessionsTest, SilentWorkersAndClosedSessions) {
  Hello(ids_[0]);
  Hello(ids_[1]).polls_in_flight = 1;  // an open poll is presence
  clock_.Advance(std::chrono::seconds(21));
  Hello(ids_[2]);
  EXPECT_EQ(sessions_->Silent(clock_.Now(), std::chrono::seconds(20)), (std::vector<int64_t>{ids_[0]}));

  std::shared_ptr<loop::Signal> wake = sessions_->Find(ids_[0])->wake;
  EXPECT_TRUE(sessions_->Close(ids_[0], "test"));
  EXPECT_EQ(sessions_->Find(ids_[0]), nullptr);
  EXPECT_FALSE(sessions_->Close(ids_[0], "test"));
  EXPECT_EQ(sessions_->all().size(), 2u);

  // A closed session's status is the caller's to store (Service::EndSession): offline, written at once.
  Await(sessions_->SetWorkerStatus(ids_[0], WorkerStatus::kOffline));
  EXPECT_EQ(Stored(ids_[0]).status, WorkerStatus::kOffline);
  EXPECT_EQ(changes_.back()["status"], "offline");
}

}  // namespace
}  // namespace parsyn::coordinator
