#include "http/direct_socket_body.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace parsyn::http {

StatusOr<size_t> DirectSocketBody::Read(std::span<char> out) {
  TimePoint now = std::chrono::steady_clock::now();
  window_.ReadStarts(now);
  const uint64_t got = received_.load(std::memory_order_relaxed);
  if (got == length_ || out.empty()) return 0;
  const size_t want = static_cast<size_t>(std::min<uint64_t>(out.size(), length_ - got));
  if (prefix_used_ < prefix_.size()) {
    const size_t n = std::min(want, prefix_.size() - prefix_used_);
    std::memcpy(out.data(), prefix_.data() + prefix_used_, n);
    prefix_used_ += n;
    return Received(n, now);
  }
  const TimePoint stall_deadline = now + stall_timeout_;
  while (true) {
    const ssize_t n = ::recv(fd_, out.data(), want, MSG_DONTWAIT);
    if (n > 0) return Received(static_cast<size_t>(n), std::chrono::steady_clock::now());
    if (n == 0) return UnavailableError("client went away while sending the body: the connection was closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return UnavailableError(std::string("client went away while sending the body: ") + std::strerror(errno));
    }
    now = std::chrono::steady_clock::now();
    if (now >= stall_deadline) {
      return DeadlineExceededError("request body stalled for more than " + std::to_string(stall_timeout_.count()) +
                                   " ms");
    }
    TimePoint wake = stall_deadline;
    if (window_.enabled()) {
      if (now >= window_.end()) {
        PARSYN_RETURN_IF_ERROR(window_.CheckAtEnd(received_.load(std::memory_order_relaxed), now));
        continue;
      }
      wake = std::min(wake, window_.end());
    }
    pollfd waiting{.fd = fd_, .events = POLLIN, .revents = 0};
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (::poll(&waiting, 1, static_cast<int>(std::max<int64_t>(1, wait_ms))) < 0 && errno != EINTR) {
      return UnavailableError(std::string("waiting for the request body failed: ") + std::strerror(errno));
    }
  }
}

}  // namespace parsyn::http
