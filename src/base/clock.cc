#include "base/clock.h"

#include <condition_variable>
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

}  // namespace parsyn
