#include "base/clock.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace parsyn
