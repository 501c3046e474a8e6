#include "http/body_rate_window.h"

#include <gtest/gtest.h>

namespace parsyn::http {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// 1,000 bytes/s over 100 ms windows: 100 bytes a window; the first window is 50 ms longer (the grace).
constexpr BodyRate kRate{.bytes_per_second = 1000, .window = milliseconds(100), .grace = milliseconds(50)};

TEST(BodyRateWindowTest, TheFirstWindowIncludesTheGraceAndAMetQuotaStartsTheNext) {
  BodyRateWindow window(kRate);
  const Clock::time_point t0{};
  window.ReadStarts(t0);
  EXPECT_EQ(window.end(), t0 + milliseconds(150));
  window.ReadReturns(99, t0 + milliseconds(10));  // short of the quota: the window goes on
  EXPECT_EQ(window.end(), t0 + milliseconds(150));
  window.ReadReturns(100, t0 + milliseconds(20));  // the quota: a new window from now
  EXPECT_EQ(window.end(), t0 + milliseconds(120));
}

TEST(BodyRateWindowTest, TheHandlersTimeBetweenReadsDoesNotCountAgainstTheClient) {
  BodyRateWindow window(kRate);
  const Clock::time_point t0{};
  window.ReadStarts(t0);
  window.ReadReturns(10, t0 + milliseconds(5));
  window.ReadStarts(t0 + milliseconds(505));  // the handler took 500 ms with the bytes
  EXPECT_EQ(window.end(), t0 + milliseconds(650));
}

TEST(BodyRateWindowTest, ASlowBodyIsCutSayingHowSlow) {
  BodyRateWindow window(kRate);
  const Clock::time_point t0{};
  window.ReadStarts(t0);
  const Status first = window.CheckAtEnd(40, t0 + milliseconds(150));
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(first.message(),
            "request body too slow: 40 bytes in 150 ms, below the minimum of 1000 bytes/s (averaged over 100 ms); "
            "the body was cut off");
  // A window that met its quota starts the next, which has no grace.
  EXPECT_TRUE(window.CheckAtEnd(100, t0 + milliseconds(150)).ok());
  EXPECT_EQ(window.end(), t0 + milliseconds(250));
  const Status later = window.CheckAtEnd(150, t0 + milliseconds(250));
  EXPECT_NE(later.message().find("50 bytes in 100 ms"), std::string::npos) << later.message();
}

TEST(BodyRateWindowTest, NoMinimumIsNeverEnabled) {
  BodyRateWindow window(BodyRate{});
  EXPECT_FALSE(window.enabled());
  EXPECT_TRUE(BodyRateWindow(kRate).enabled());
}

}  // namespace
}  // namespace parsyn::http
