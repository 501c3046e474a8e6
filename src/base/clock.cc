#include "base/clock.h"

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

}  // namespace parsyn
