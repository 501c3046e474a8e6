#include "base/clock.h"

#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace parsyn {

Clock::TimePoint SystemClock::Now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

int64_t SystemClock::UnixMillis() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock& SystemClock::Get() {
  static SystemClock clock;
  return clock;
}

bool SleepUnlessStopped(std::chrono::milliseconds pause, std::stop_token stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  return !(cv.wait_for(lock, stop, pause, [] { return false; }) || stop.stop_requested());
}

std::string Rfc3339Millis(int64_t unix_ms) {
  const int64_t ms = ((unix_ms % 1000) + 1000) % 1000;
  const std::time_t seconds = static_cast<std::time_t>((unix_ms - ms) / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(ms));
  return text;
}

}  // namespace parsyn
