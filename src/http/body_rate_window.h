// BodyRateWindow: the minimum rate of a streamed request body (RouteOptions::min_body_rate, BodyRate), as windows.
// One implementation for both body readers of the server: the loop's (chunks through Beast's parser, checked by a
// timer at the window's end) and the direct one (recv() on an upload thread, checked when poll() wakes).
//
// The rule: the clock starts at the first read; the first window lasts grace + window, each later one `window`; a
// window must bring bytes_per_second * window bytes, and a new window starts as soon as it has. The time the handler
// spends between reads (hashing, writing) does not count against the client: each read pushes the window's end by
// the time since the previous read returned.
// Not thread-safe: one reader's thread (or the loop) only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "http/server.h"

namespace parsyn::http {

class BodyRateWindow {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit BodyRateWindow(BodyRate rate) : rate_(rate) {}

  // False when the route has no minimum: then nothing here needs calling, and end() means nothing.
  bool enabled() const { return rate_.bytes_per_second > 0; }

  // A read begins at `now`.
  void ReadStarts(TimePoint now) {
    if (!enabled()) return;
    if (!started_) {
      started_ = true;
      end_ = now + rate_.grace + rate_.window;
    } else {
      end_ += now - last_return_;
    }
  }
  // A read returns at `now`, with `received` bytes of the body in all: a window that has its quota is over.
  void ReadReturns(uint64_t received, TimePoint now) {
    if (enabled() && received - mark_ >= Quota()) StartWindow(received, now);
    last_return_ = now;
  }
  // The bytes arrived while a read waits (the part of a chunk read so far included), at `now` >= end(): OK and a new
  // window when the quota was met, else DeadlineExceeded saying how slow the body was (the body is cut).
  Status CheckAtEnd(uint64_t received, TimePoint now) {
    if (received - mark_ >= Quota()) {
      StartWindow(received, now);
      return Status::Ok();
    }
    const auto span = rate_.window.count() + (first_ ? rate_.grace.count() : 0);
    return DeadlineExceededError("request body too slow: " + std::to_string(received - mark_) + " bytes in " +
                                 std::to_string(span) + " ms, below the minimum of " +
                                 std::to_string(rate_.bytes_per_second) + " bytes/s (averaged over " +
                                 std::to_string(rate_.window.count()) + " ms); the body was cut off");
  }
  // When the current window ends (after a ReadStarts).
  TimePoint end() const { return end_; }
  const BodyRate& rate() const { return rate_; }

 private:
  uint64_t Quota() const {
    return rate_.bytes_per_second * static_cast<uint64_t>(std::max<int64_t>(1, rate_.window.count())) / 1000;
  }
  void StartWindow(uint64_t received, TimePoint now) {
    first_ = false;
    mark_ = received;
    end_ = now + rate_.window;
  }

  const BodyRate rate_;
  bool started_ = false;
  bool first_ = true;  // the first window is longer by the grace
  uint64_t mark_ = 0;  // the bytes received when the current window began
  TimePoint end_{};
  TimePoint last_return_{};
};

}  // namespace parsyn::http
