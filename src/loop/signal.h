// Signal: "wait until notified or timeout" for coroutines on one io_context (long-poll, SSE, shutdown).
//
// A Signal belongs to the executor it was made with; Notify(), Wait() and WaitAny() must run on that executor's
// single thread (the coordinator's event loop), so there are no locks. Notify() wakes every coroutine waiting at
// that moment; a notification with nobody waiting is not remembered (check your condition before waiting, the usual
// condition-variable discipline: `while (!ready) if (!co_await sig.Wait(deadline_left)) break;`).
// Destroying a Signal while coroutines wait on it is a programmer error.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <list>
#include <span>
#include <vector>

namespace parsyn::loop {

// The coroutine type of the event loop, for every layer from here up (http:: names it too).
template <typename T>
using Awaitable = boost::asio::awaitable<T>;

class Signal {
 public:
  explicit Signal(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}
  Signal(const Signal&) = delete;
  Signal& operator=(const Signal&) = delete;

  // Wakes every coroutine currently waiting on this signal.
  void Notify();
  // Returns true when notified, false when `timeout` passed first.
  boost::asio::awaitable<bool> Wait(std::chrono::milliseconds timeout);

  const boost::asio::any_io_executor& executor() const { return executor_; }

 private:
  friend boost::asio::awaitable<int> WaitAny(std::span<Signal* const>, std::chrono::milliseconds);
  struct Waiter;
  boost::asio::any_io_executor executor_;
  std::list<Waiter*> waiters_;  // a list: each waiter leaves in O(1) (thousands of long-polls wait on signals)
};

// Waits on several signals at once. Returns the index (in `signals`) of the first one notified, or -1 when
// `timeout` passed first. All signals must share the calling coroutine's executor.
// Pass a named std::array: g++ 12 miscompiles braced initializer lists inside co_await expressions.
boost::asio::awaitable<int> WaitAny(std::span<Signal* const> signals, std::chrono::milliseconds timeout);

}  // namespace parsyn::loop
