// An injectable clock, so timeouts (heartbeats, aggregation_timeout) are testable without sleeping.
//
// Clock::Now() is monotonic (for deadlines); Clock::UnixMillis() is wall time (for timestamps users see).
// SystemClock is safe from any thread. FakeClock is safe from any thread; it only moves when Advance() is called.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stop_token>
#include <string>

namespace parsyn {

class Clock {
 public:
  using Duration = std::chrono::milliseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  virtual int64_t UnixMillis() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  int64_t UnixMillis() const override;
  // The process-wide system clock.
  static Clock& Get();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_unix_ms = 1'700'000'000'000) : unix_ms_(start_unix_ms) {}
  TimePoint Now() const override { return TimePoint(Duration(monotonic_ms_.load())); }
  int64_t UnixMillis() const override { return unix_ms_.load(); }
  void Advance(Duration d) {
    monotonic_ms_ += d.count();
    unix_ms_ += d.count();
  }

 private:
  std::atomic<int64_t> monotonic_ms_{0};
  std::atomic<int64_t> unix_ms_;
};

// Sleeps for `pause` on the calling thread (real time, not a Clock's) unless `stop` is requested before or during it,
// which ends it at once. False when stopped. Thread-safe.
bool SleepUnlessStopped(std::chrono::milliseconds pause, std::stop_token stop);

// Unix milliseconds as UTC RFC 3339 text with milliseconds: "2026-12-05T17:03:11.123Z".
std::string Rfc3339Millis(int64_t unix_ms);

}  // namespace parsyn
