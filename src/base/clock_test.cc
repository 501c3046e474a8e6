#include "base/clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace parsyn {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock(1000);
  Clock::TimePoint t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(std::chrono::seconds(3));
  EXPECT_EQ(clock.Now() - t0, std::chrono::milliseconds(3000));
  EXPECT_EQ(clock.UnixMillis(), 4000);
}

TEST(ClockTest, SystemClockIsMonotonic) {
  Clock& clock = SystemClock::Get();
  Clock::TimePoint a = clock.Now();
  Clock::TimePoint b = clock.Now();
  EXPECT_LE(a, b);
  EXPECT_GT(clock.UnixMillis(), 1'600'000'000'000);  // after 2020
}

TEST(ClockTest, SleepUnlessStoppedSleepsOrEndsAtTheStop) {
  using std::chrono::milliseconds;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(SleepUnlessStopped(milliseconds(20), std::stop_token()));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));

  std::stop_source stopped;
  stopped.request_stop();
  EXPECT_FALSE(SleepUnlessStopped(std::chrono::hours(1), stopped.get_token()));

  // A stop during the sleep ends it: an hour's sleep returns false once the other thread asks.
  std::stop_source source;
  std::jthread stopper([&source] {
    std::this_thread::sleep_for(milliseconds(50));
    source.request_stop();
  });
  EXPECT_FALSE(SleepUnlessStopped(std::chrono::hours(1), source.get_token()));
}

}  // namespace
}  // namespace parsyn
