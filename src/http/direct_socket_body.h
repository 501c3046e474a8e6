// The request body reader that takes a plain-TCP connection's socket for the handler's own thread
// (BodyReader::TakeDirect); internal to the layer (connection.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"
#include "http/body_rate_window.h"
#include "http/server.h"

namespace parsyn::http {

// A Content-Length body received on the caller's thread straight from the socket (BodyReader::TakeDirect): first the
// bytes that came in with the header, then recv() into the caller's buffer, waiting with poll(). The limits are
// Body's: body_timeout per Read, and the minimum rate with the same windows and messages.
class DirectSocketBody final : public DirectBody {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  DirectSocketBody(int fd, std::string prefix, uint64_t length, std::chrono::milliseconds stall_timeout, BodyRate rate)
      : fd_(fd), prefix_(std::move(prefix)), length_(length), stall_timeout_(stall_timeout), window_(rate) {}

  StatusOr<size_t> Read(std::span<char> out) override;

  uint64_t received() const { return received_.load(std::memory_order_acquire); }
  bool complete() const { return received() == length_; }

 private:
  StatusOr<size_t> Received(size_t n, TimePoint now) {
    const uint64_t total = received_.fetch_add(n, std::memory_order_acq_rel) + n;
    window_.ReadReturns(total, now);
    return n;
  }

  const int fd_;
  const std::string prefix_;  // body bytes that arrived with the header
  size_t prefix_used_ = 0;
  const uint64_t length_;
  const std::chrono::milliseconds stall_timeout_;
  BodyRateWindow window_;
  std::atomic<uint64_t> received_{0};
};

}  // namespace parsyn::http
