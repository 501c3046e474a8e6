#include "loop/signal.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

namespace parsyn::loop {
namespace {

namespace net = boost::asio;
using std::chrono::milliseconds;

TEST(SignalTest, NotifyWakesEveryWaiter) {
  net::io_context io;
  Signal signal(io.get_executor());
  std::vector<bool> results;
  auto waiter = [&]() -> net::awaitable<void> { results.push_back(co_await signal.Wait(milliseconds(10'000))); };
  net::co_spawn(io, waiter(), net::detached);
  net::co_spawn(io, waiter(), net::detached);
  net::post(io, [&] { signal.Notify(); });  // runs after both coroutines reached Wait()
  auto start = std::chrono::steady_clock::now();
  io.run();
  EXPECT_EQ(results, (std::vector<bool>{true, true}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5'000));
}

TEST(SignalTest, TimesOutAndForgetsEarlierNotifications) {
  net::io_context io;
  Signal signal(io.get_executor());
  signal.Notify();  // nobody waits yet: not remembered
  std::optional<bool> result;
  net::co_spawn(
      io, [&]() -> net::awaitable<void> { result = co_await signal.Wait(milliseconds(30)); }, net::detached);
  auto start = std::chrono::steady_clock::now();
  io.run();
  ASSERT_TRUE(result.has_value());
  EXPECT_FALSE(*result);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(30));
}

TEST(SignalTest, WaitAnyReportsWhichSignalFired) {
  net::io_context io;
  Signal work(io.get_executor());
  Signal stopping(io.get_executor());
  int woken = -2;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        std::array<Signal*, 2> signals{&work, &stopping};
        woken = co_await WaitAny(signals, milliseconds(10'000));
      },
      net::detached);
  net::post(io, [&] { stopping.Notify(); });
  io.run();
  EXPECT_EQ(woken, 1);

  io.restart();
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        std::array<Signal*, 2> signals{&work, &stopping};
        woken = co_await WaitAny(signals, milliseconds(1));
      },
      net::detached);
  io.run();
  EXPECT_EQ(woken, -1);
}

TEST(SignalTest, WaitersThatTimedOutAreGoneAndTheRestAreWoken) {
  net::io_context io;
  Signal a(io.get_executor());
  Signal b(io.get_executor());
  std::vector<int> woken(60, -2);
  for (int i = 0; i < 60; ++i) {
    net::co_spawn(
        io,
        [&, i]() -> net::awaitable<void> {
          std::array<Signal*, 2> signals{&a, &b};
          // Every third waits briefly and leaves; the rest wait until notified.
          woken[static_cast<size_t>(i)] = co_await WaitAny(signals, milliseconds(i % 3 == 0 ? 1 : 10'000));
        },
        net::detached);
  }
  net::steady_timer later(io, milliseconds(50));
  later.async_wait([&](const boost::system::error_code&) { b.Notify(); });
  io.run();
  for (int i = 0; i < 60; ++i) EXPECT_EQ(woken[static_cast<size_t>(i)], i % 3 == 0 ? -1 : 1) << i;
}

}  // namespace
}  // namespace parsyn::loop
