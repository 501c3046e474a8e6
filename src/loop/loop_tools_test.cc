#include "loop/loop_tools.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace parsyn::loop {
namespace {

namespace net = boost::asio;

// YieldToLoop lets what is queued on the loop run before the yielding coroutine goes on (a heartbeat between a
// round start's tasks).
TEST(YieldToLoopTest, WhatIsQueuedRunsBeforeTheYielderGoesOn) {
  net::io_context io;
  std::vector<std::string> order;
  net::co_spawn(
      io,
      [&]() -> Awaitable<void> {
        order.push_back("long work, first slice");
        co_await YieldToLoop();
        order.push_back("long work, second slice");
      },
      net::detached);
  net::post(io, [&] { order.push_back("heartbeat"); });
  io.run();
  EXPECT_EQ(order, (std::vector<std::string>{"long work, first slice", "heartbeat", "long work, second slice"}));
}

// The ticker's ticks run on the loop, due on a grid `interval` apart; a loop busy for many intervals gets one tick
// when it is free again, not one per interval it missed.
TEST(LoopTickerTest, TicksRunOnTheLoopAndDoNotPileUpWhileItIsBusy) {
  net::io_context io;
  const std::chrono::milliseconds interval{20};
  const auto start = std::chrono::steady_clock::now();
  std::vector<LoopTicker::TimePoint> dues;
  bool off_the_loop = false;
  const std::thread::id loop_thread = std::this_thread::get_id();
  // The busy handler goes first in the loop's queue, before the ticker's thread can post anything: on a loaded
  // machine this thread may be descheduled for more than an interval between two statements.
  const auto busy_until = start + 10 * interval;
  net::post(io, [&] { std::this_thread::sleep_until(busy_until); });
  LoopTicker ticker(io.get_executor(), interval, [&](LoopTicker::TimePoint due) {
    off_the_loop |= std::this_thread::get_id() != loop_thread;
    dues.push_back(due);
  });
  auto keep_running = net::make_work_guard(io);  // between ticks the io_context has nothing of its own to run
  io.run_for(20 * interval);
  EXPECT_FALSE(off_the_loop);
  ASSERT_GE(dues.size(), 2u) << "ticks after the loop was free again";
  EXPECT_LE(std::count_if(dues.begin(), dues.end(), [&](auto due) { return due < busy_until; }), 1)
      << "the ticks the busy loop missed were queued one by one";
  for (size_t i = 1; i < dues.size(); ++i) {
    EXPECT_GT(dues[i], dues[i - 1]);
    EXPECT_EQ((dues[i] - dues[0]) % interval, std::chrono::steady_clock::duration::zero()) << "off the grid";
  }
}

// A tick still in the loop's queue when the ticker is destroyed does nothing (its owner may be gone).
TEST(LoopTickerTest, ATickQueuedBeforeDestructionDoesNothing) {
  net::io_context io;
  int ticks = 0;
  auto ticker = std::make_unique<LoopTicker>(io.get_executor(), std::chrono::milliseconds(5), [&](auto) { ++ticks; });
  net::post(io, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the ticker posts a tick meanwhile
    ticker.reset();
  });
  io.run();
  EXPECT_EQ(ticks, 0);
}

TEST(LoopMutexTest, OneHolderAtATimeInTheOrderTheyAsked) {
  net::io_context io;
  LoopMutex mutex(io.get_executor());
  std::vector<int> order;
  int holders = 0;
  int most_holders = 0;
  auto contender = [&](int id) -> Awaitable<void> {
    co_await mutex.Lock();
    LoopLock lock(mutex);
    ++holders;
    most_holders = std::max(most_holders, holders);
    order.push_back(id);
    co_await YieldToLoop();  // the others queue up meanwhile
    co_await YieldToLoop();
    --holders;
  };
  constexpr int kContenders = 200;
  for (int i = 0; i < kContenders; ++i) net::co_spawn(io, contender(i), net::detached);
  io.run();
  ASSERT_EQ(order.size(), static_cast<size_t>(kContenders));
  EXPECT_EQ(most_holders, 1);
  for (int i = 0; i < kContenders; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);

  // Free again: a later Lock() takes it at once.
  bool took = false;
  io.restart();
  net::co_spawn(
      io,
      [&]() -> Awaitable<void> {
        co_await mutex.Lock();
        took = true;
        mutex.Unlock();
      },
      net::detached);
  io.run();
  EXPECT_TRUE(took);
}

TEST(LoopMutexTest, AWaiterDestroyedWhileQueuedLeavesTheQueue) {
  std::optional<LoopMutex> mutex;
  {
    net::io_context io;
    mutex.emplace(io.get_executor());
    net::co_spawn(
        io,
        [&]() -> Awaitable<void> {
          co_await mutex->Lock();  // held for good
          net::steady_timer forever(co_await net::this_coro::executor, std::chrono::hours(1));
          co_await forever.async_wait(net::use_awaitable);
        },
        net::detached);
    net::co_spawn(
        io, [&]() -> Awaitable<void> { co_await mutex->Lock(); }, net::detached);
    io.run_for(std::chrono::milliseconds(50));
    // `io` goes with both coroutines in it: the queued one leaves the queue as its frame is destroyed.
  }
  mutex->Unlock();  // the holder's turn ends: nobody is queued, so the mutex is simply free
  net::io_context io;
  bool took = false;
  LoopMutex& m = *mutex;
  net::co_spawn(
      io,
      [&]() -> Awaitable<void> {
        co_await m.Lock();
        took = true;
      },
      net::detached);
  io.run();
  EXPECT_TRUE(took);
}

}  // namespace
}  // namespace parsyn::loop
