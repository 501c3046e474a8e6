#include "loop/signal.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>

namespace parsyn::loop {

namespace net = boost::asio;

// One waiting coroutine. It lives in that coroutine's frame and is registered with every signal it waits on.
struct Signal::Waiter {
  explicit Waiter(const net::any_io_executor& ex) : timer(ex) {}
  net::steady_timer timer;
  std::vector<Signal*> signals;
  std::vector<std::list<Waiter*>::iterator> positions;  // in each signal's waiters_, same order as `signals`
  int fired = -1;                                       // index into `signals` of the first notifier
};

void Signal::Notify() {
  // cancel() only queues the waiters' resumptions, so none of them leaves the list while it is walked.
  for (Waiter* w : waiters_) {
    if (w->fired < 0) {
      auto it = std::find(w->signals.begin(), w->signals.end(), this);
      w->fired = static_cast<int>(it - w->signals.begin());
    }
    w->timer.cancel();
  }
}

net::awaitable<bool> Signal::Wait(std::chrono::milliseconds timeout) {
  std::array<Signal*, 1> self{this};
  co_return (co_await WaitAny(self, timeout)) == 0;
}

net::awaitable<int> WaitAny(std::span<Signal* const> signals, std::chrono::milliseconds timeout) {
  Signal::Waiter waiter(co_await net::this_coro::executor);
  waiter.signals.assign(signals.begin(), signals.end());
  // Unregisters even when the coroutine is destroyed mid-wait (io_context torn down).
  struct Registration {
    Signal::Waiter* w;
    explicit Registration(Signal::Waiter* w) : w(w) {
      for (Signal* s : w->signals) w->positions.push_back(s->waiters_.insert(s->waiters_.end(), w));
    }
    ~Registration() {
      for (size_t i = 0; i < w->signals.size(); ++i) w->signals[i]->waiters_.erase(w->positions[i]);
    }
  } registration(&waiter);

  waiter.timer.expires_after(std::max(timeout, std::chrono::milliseconds(0)));
  boost::system::error_code ec;  // operation_aborted when notified; the outcome is read from `fired`
  co_await waiter.timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  co_return waiter.fired;
}

}  // namespace parsyn::loop
