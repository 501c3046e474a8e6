// LeaderElection on its own: a scripted lease (what a shared store answers), a real io_context and a short lease.
#include "coordinator/leader_election.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace parsyn::coordinator {
namespace {

constexpr std::chrono::milliseconds kTtl{300};

// The lease the store answers each call with (the last one again once the script is used up), and who released it.
struct ScriptedLease {
  std::mutex mu;
  std::deque<storage::LeaderLease> answers;
  int asked = 0;
  std::vector<std::string> released;

  LeaderElection::LeaseStore Calls() {
    return {.acquire = [this](const std::string&, const std::string&,
                              std::chrono::milliseconds) -> StatusOr<storage::LeaderLease> {
              std::lock_guard lock(mu);
              ++asked;
              storage::LeaderLease answer = answers.front();
              if (answers.size() > 1) answers.pop_front();
              return answer;
            },
            .release =
                [this](const std::string& holder) {
                  std::lock_guard lock(mu);
                  released.push_back(holder);
                  return Status::Ok();
                }};
  }
};

storage::LeaderLease Held() { return {.held = true, .epoch = 2, .holder = "me", .holder_url = "http://me:8080"}; }
storage::LeaderLease OtherHolds() {
  return {.held = false, .epoch = 2, .holder = "other", .holder_url = "http://leader:8080"};
}

class LeaderElectionTest : public ::testing::Test {
 protected:
  LeaderElection Election(LeaderElection::TakeOver take_over = {}) {
    if (!take_over.prepare)
      take_over.prepare = [this]() -> http::Awaitable<Status> {
        ++prepared_;
        co_return prepare_status_;
      };
    if (!take_over.resume) take_over.resume = [this] { ++resumed_; };
    return LeaderElection(
        io_.get_executor(), clock_, pool_, "me", kTtl, [] { return std::string("http://me:8080"); }, lease_.Calls(),
        std::move(take_over));
  }

  // Runs the election for `run_for` (real time), then stops it and runs the loop until it has ended.
  void RunFor(LeaderElection& election, std::chrono::milliseconds run_for) {
    boost::asio::co_spawn(io_, election.Run(), boost::asio::detached);
    boost::asio::co_spawn(
        io_,
        [&election, run_for]() -> http::Awaitable<void> {
          boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, run_for);
          co_await timer.async_wait(boost::asio::use_awaitable);
          election.Stop();
        },
        boost::asio::detached);
    auto work = boost::asio::make_work_guard(io_);
    // Run's last lease call runs on the pool: keep the loop alive a little past the stop.
    io_.run_for(run_for + std::chrono::milliseconds(500));
  }

  boost::asio::io_context io_;
  boost::asio::thread_pool pool_{1};
  SystemClock clock_;
  ScriptedLease lease_;
  int prepared_ = 0;
  int resumed_ = 0;
  Status prepare_status_;
};

TEST_F(LeaderElectionTest, StandbyNamesTheLeaderOnceTheLeaseDoes) {
  lease_.answers = {OtherHolds()};
  LeaderElection election = Election();
  EXPECT_FALSE(election.leader());
  EXPECT_EQ(election.LeaderStatus().code(), StatusCode::kUnavailable);
  EXPECT_EQ(election.LeaderStatus().message(),
            "this coordinator is a standby and no leader is known yet: retry in a few seconds");

  RunFor(election, std::chrono::milliseconds(100));
  EXPECT_GE(lease_.asked, 2);  // a standby asks every tenth of the lease
  EXPECT_FALSE(election.leader());
  EXPECT_EQ(election.leader_url(), "http://leader:8080");
  EXPECT_EQ(election.LeaderStatus().message(),
            "this coordinator is a standby; the leader is http://leader:8080: send the call there");
  EXPECT_EQ(prepared_, 0);
  EXPECT_TRUE(lease_.released.empty());  // a standby has nothing to give back
}

TEST_F(LeaderElectionTest, TakesOverThroughTheServiceAndGivesTheLeaseBackOnStop) {
  lease_.answers = {OtherHolds(), Held()};
  LeaderElection election = Election();
  RunFor(election, std::chrono::milliseconds(150));
  EXPECT_TRUE(election.leader());
  EXPECT_TRUE(election.LeaderStatus().ok());
  EXPECT_EQ(election.leader_url(), "http://me:8080");
  EXPECT_EQ(prepared_, 1);  // once, however often the lease is renewed
  EXPECT_EQ(resumed_, 1);
  EXPECT_EQ(lease_.released, (std::vector<std::string>{"me"}));
}

TEST_F(LeaderElectionTest, ServiceNotReadyGivesTheLeaseBackAndStaysAStandby) {
  lease_.answers = {Held()};
  prepare_status_ = UnavailableError("the store is down");
  LeaderElection election = Election();
  RunFor(election, std::chrono::milliseconds(50));
  EXPECT_FALSE(election.leader());
  EXPECT_GE(prepared_, 1);
  EXPECT_EQ(resumed_, 0);
  ASSERT_FALSE(lease_.released.empty());
  EXPECT_EQ(lease_.released[0], "me");
}

TEST_F(LeaderElectionTest, LeadingAloneNeedsNoLease) {
  LeaderElection election = Election();
  election.LeadAlone();
  EXPECT_TRUE(election.leader());
  EXPECT_TRUE(election.LeaderStatus().ok());
  EXPECT_EQ(lease_.asked, 0);
}

TEST(LeaderElectionDeathTest, LosingTheLeaseEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto lose_the_lease = [] {
    boost::asio::io_context io;
    boost::asio::thread_pool pool(1);
    SystemClock clock;
    ScriptedLease lease;
    lease.answers = {Held(), OtherHolds()};
    LeaderElection::TakeOver take_over{.prepare = []() -> http::Awaitable<Status> { co_return Status::Ok(); },
                                       .resume = [] {}};
    LeaderElection election(
        io.get_executor(), clock, pool, "me", kTtl, [] { return std::string("http://me:8080"); }, lease.Calls(),
        std::move(take_over));
    boost::asio::co_spawn(io, election.Run(), boost::asio::detached);
    auto work = boost::asio::make_work_guard(io);
    io.run_for(std::chrono::seconds(5));
  };
  EXPECT_EXIT(lose_the_lease(), ::testing::ExitedWithCode(kExitLeadershipLost), "");
}

}  // namespace
}  // namespace parsyn::coordinator
