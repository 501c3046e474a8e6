// Connection<Stream>::Body: the request body reader of one connection (BodyReader: chunks through Beast, with the
// route's cap, the stall timeout, the minimum rate and the buffered body's deadline; or, on plain TCP, the socket
// handed to the handler's thread as a DirectSocketBody). Internal to the layer: the end of connection.h includes it.
#pragma once

#include "http/connection.h"

namespace parsyn::http {

template <class Stream>
class Connection<Stream>::Body final : public BodyReader {
 public:
  Body(Connection& conn, RequestParser& parser, uint64_t cap, BodyRate rate)
      : conn_(conn), parser_(parser), cap_(cap), window_(rate) {}
  ~Body() override {
    if (direct_) conn_.EndDirect(*direct_);
  }

  asio::awaitable<StatusOr<std::string_view>> Next() override {
    if (direct_) co_return InternalError("the body was handed to a direct reader (TakeDirect)");
    next_called_ = true;
    window_.ReadStarts(std::chrono::steady_clock::now());
    if (!chunk_ && !parser_.is_done()) {
      // A small body's own size: most requests (heartbeats, results) carry a few hundred bytes, and 64 KiB each was
      // an allocation of jemalloc's large class per request.
      const auto length = parser_.content_length();
      chunk_bytes_ = length && *length > 0 ? std::min<uint64_t>(*length, kBodyChunkBytes) : kBodyChunkBytes;
      chunk_.reset(new char[chunk_bytes_]);
    }
    while (!parser_.is_done()) {
      parser_.get().body().data = chunk_.get();
      parser_.get().body().size = chunk_bytes_;
      beast::error_code ec;
      if (!ParseBuffered(ec)) {
        conn_.Lowest().expires_after(conn_.opts_.body_timeout);
        ArmRateTimer();
        ArmDeadlineTimer();
        co_await bhttp::async_read(conn_.stream_, conn_.buffer_, parser_, redirect_error(use_awaitable, ec));
        ++read_generation_;  // a rate or deadline timer firing from now on belongs to a finished read
        if (rate_timer_) rate_timer_->cancel();
        if (deadline_timer_) deadline_timer_->cancel();
      }
      if (ec == bhttp::error::need_buffer) ec = {};
      if (too_slow_) co_return DeadlineExceededError(too_slow_message_);
      if (ec == beast::error::timeout) {
        co_return DeadlineExceededError("request body stalled for more than " +
                                        std::to_string(conn_.opts_.body_timeout.count()) + " ms");
      }
      if (IsHttpParseError(ec)) co_return InvalidArgumentError("malformed request body: " + ec.message());
      if (ec) co_return UnavailableError("client went away while sending the body: " + ec.message());
      size_t n = chunk_bytes_ - parser_.get().body().size;
      received_ += n;
      conn_.body_bytes_ += n;
      if (received_ > cap_) {
        co_return ResourceExhaustedError("request body exceeds the limit of " + std::to_string(cap_) + " bytes");
      }
      window_.ReadReturns(received_, std::chrono::steady_clock::now());
      if (n > 0) co_return std::string_view(chunk_.get(), n);
    }
    co_return std::string_view();
  }

  // The whole body must have arrived by `deadline` (buffered bodies: ServerOptions::buffered_body_deadline).
  void SetDeadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

  std::optional<uint64_t> content_length() const override {
    auto length = parser_.content_length();
    return length ? std::optional<uint64_t>(*length) : std::nullopt;
  }

  std::shared_ptr<DirectBody> TakeDirect() override {
    if constexpr (kTls) {
      return nullptr;  // TLS records need the stream's state: such bodies go through Next()
    } else {
      if (next_called_ || direct_ || parser_.chunked() || !parser_.content_length()) return nullptr;
      const uint64_t length = *parser_.content_length();
      if (length > cap_) return nullptr;  // Next() answers it with the cap's error
      // The body's first bytes may have arrived with the header: they are in the connection's buffer.
      const auto buffered = conn_.buffer_.data();
      const size_t take = static_cast<size_t>(std::min<uint64_t>(buffered.size(), length));
      std::string prefix(static_cast<const char*>(buffered.data()), take);
      conn_.buffer_.consume(take);
      conn_.Lowest().expires_never();  // no Beast operation runs until the reader is done
      direct_ = std::make_shared<DirectSocketBody>(conn_.Lowest().socket().native_handle(), std::move(prefix), length,
                                                   conn_.opts_.body_timeout, window_.rate());
      conn_.direct_reading_ = true;
      return direct_;
    }
  }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Parses body bytes that arrived with the header (or an earlier read) without going to the socket: false when
  // there are none, or none the parser takes yet (then a read brings more). Beast's async_read posts its completion
  // when it needs no read, and each post waits a whole pass of the loop's queue: when the loop is saturated (a round
  // at 10,000 workers) a small request such as a heartbeat waited two passes instead of one.
  bool ParseBuffered(beast::error_code& ec) {
    if (conn_.buffer_.size() == 0) return false;
    parser_.eager(true);  // as async_read sets it: on through the body's structure while bytes remain
    const size_t used = parser_.put(conn_.buffer_.data(), ec);
    conn_.buffer_.consume(used);
    if (ec == bhttp::error::need_more) ec = {};
    return used > 0 || ec;
  }

  // BodyRate: the bytes each window must bring; the first window (from the first Next) is longer by the grace.
  // At the body's deadline (SetDeadline), a read still waiting is cancelled and the body cut, as for the rate: the
  // answer still goes out (a socket timeout would close the connection before it).
  void ArmDeadlineTimer() {
    if (!deadline_) return;
    if (!deadline_timer_) {
      deadline_timer_.emplace(conn_.stream_.get_executor());
      if (!alive_) alive_ = std::make_shared<int>(0);
    }
    deadline_timer_->expires_at(*deadline_);
    deadline_timer_->async_wait(
        [this, alive = std::weak_ptr<int>(alive_), generation = read_generation_](const beast::error_code& ec) {
          if (ec || alive.expired() || generation != read_generation_) return;
          too_slow_ = true;
          too_slow_message_ = "request body not complete within " +
                              std::to_string(conn_.opts_.buffered_body_deadline.count()) + " ms (" +
                              std::to_string(received_ + (chunk_bytes_ - parser_.get().body().size)) +
                              " bytes received); send the whole body at once";
          beast::error_code ignored;
          conn_.Lowest().socket().cancel(ignored);
        });
  }
  // At the window's end, what arrived (including the part of the chunk being read) is compared with the quota: a
  // new window starts, or the read is cancelled and the body cut.
  void ArmRateTimer() {
    if (!window_.enabled()) return;
    if (!rate_timer_) {
      rate_timer_.emplace(conn_.stream_.get_executor());
      if (!alive_) alive_ = std::make_shared<int>(0);
    }
    rate_timer_->expires_at(window_.end());
    rate_timer_->async_wait(
        [this, alive = std::weak_ptr<int>(alive_), generation = read_generation_](const beast::error_code& ec) {
          if (ec || alive.expired() || generation != read_generation_) return;
          const uint64_t received = received_ + (chunk_bytes_ - parser_.get().body().size);
          Status checked = window_.CheckAtEnd(received, std::chrono::steady_clock::now());
          if (checked.ok()) {
            ArmRateTimer();
            return;
          }
          too_slow_ = true;
          too_slow_message_ = checked.message();
          beast::error_code ignored;
          conn_.Lowest().socket().cancel(ignored);
        });
  }

  Connection& conn_;
  RequestParser& parser_;
  uint64_t cap_;
  std::optional<TimePoint> deadline_;
  std::optional<asio::steady_timer> deadline_timer_;  // with deadline_, armed by the first read that waits
  uint64_t received_ = 0;
  std::unique_ptr<char[]> chunk_;  // allocated by the first Next(): most requests never read a body through it
  size_t chunk_bytes_ = 0;
  BodyRateWindow window_;
  std::optional<asio::steady_timer> rate_timer_;  // routes with a minimum rate only: not one per request
  uint64_t read_generation_ = 0;
  bool too_slow_ = false;
  std::string too_slow_message_;
  std::shared_ptr<int> alive_;  // with a timer: lets a late timer handler see the body is gone
  bool next_called_ = false;
  std::shared_ptr<DirectSocketBody> direct_;  // set by TakeDirect
};

}  // namespace parsyn::http
