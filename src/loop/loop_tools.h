// Tools for code on an event loop (one io_context thread: the coordinator's, docs/architecture.md §3):
//   - Offload: run a blocking call (store, hashing, aggregation) on the worker pool and resume on the loop with its
//     result, so the loop never blocks.
//   - LoopMutex: an async mutex for coroutines of the one loop thread (a job's events are handled one at a time
//     while their actions await the pool).
//   - SharedForAWhile: a value computed at most once per max_age, shared by the callers meanwhile.
//   - YieldToLoop / LoopSlice: long work on the loop lets what else is ready run.
//   - LoopTicker: a periodic tick posted from a thread of its own.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>

#include "base/clock.h"
#include "base/status.h"
#include "loop/signal.h"

namespace parsyn::loop {

// kCoAwaitTemporaries: g++ 12 destroys some temporaries of a co_await expression twice (double frees seen with
// std::function, std::string and lambdas holding shared_ptrs). Code here therefore never puts a temporary with a
// destructor inside a co_await: it creates the awaitable first, `auto op = f(args); co_await std::move(op);`, so
// the arguments are copied into the coroutine's frame by an ordinary statement.

// Runs `fn` on `pool` and resumes the awaiting coroutine on its own executor (the loop) with fn's result.
// `fn` must not touch loop state; it may capture references that outlive the co_await.
template <typename Fn>
Awaitable<std::invoke_result_t<Fn>> Offload(boost::asio::thread_pool& pool, Fn fn) {
  using R = std::invoke_result_t<Fn>;
  // The result travels in a shared optional: awaitable handlers want a default-constructible-free path.
  auto result = std::make_shared<std::optional<R>>();
  auto initiation = [&pool, fn = std::move(fn), result](auto handler) mutable {
    boost::asio::post(pool, [fn = std::move(fn), result, handler = std::move(handler)]() mutable {
      result->emplace(fn());
      auto executor = boost::asio::get_associated_executor(handler);
      boost::asio::post(executor, [handler = std::move(handler)]() mutable { handler(); });
    });
  };
  // Named, not a temporary inside the co_await: see kCoAwaitTemporaries below.
  auto completion = boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void()>(
      std::move(initiation), boost::asio::use_awaitable);
  co_await std::move(completion);
  co_return std::move(**result);
}

// Lets the loop run what else is ready (heartbeats, polls) before the awaiting coroutine goes on. Work that can run
// long on the loop without waiting for anything (a round start's 10,000 tasks) yields every few milliseconds:
//   LoopSlice slice;
//   for (...) { if (slice.Over()) co_await YieldToLoop(); ... }
Awaitable<void> YieldToLoop();
class LoopSlice {
 public:
  static constexpr std::chrono::milliseconds kLength{5};
  // True once this slice has run kLength (and a new slice starts now): time to yield.
  bool Over() {
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < kLength) return false;
    start_ = now;
    return true;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Calls `on_tick(due)` on the loop every `interval`, posted from a thread of its own: a tick waits one pass of the
// loop's queue. An Asio timer's expiry reaches a busy loop through epoll's ready list instead, behind every socket
// event already in it, 128 per pass: the coordinator's 100 ms tick ran 1-2.5 s late in a 10,000-worker round while
// posted work waited <= 100 ms (docs/architecture.md). Ticks the loop has not run yet are not queued twice: a loop
// busier than `interval` gets the next one when it is done. The destructor stops the thread (call it on the loop,
// or once the loop has stopped); ticks it already posted then do nothing.
class LoopTicker {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  LoopTicker(boost::asio::any_io_executor loop, std::chrono::milliseconds interval,
             std::function<void(TimePoint due)> on_tick);
  ~LoopTicker();
  LoopTicker(const LoopTicker&) = delete;
  LoopTicker& operator=(const LoopTicker&) = delete;

 private:
  // Shared with the ticks in the loop's queue, which may outlive the ticker.
  struct State {
    std::function<void(TimePoint)> on_tick;
    std::atomic<bool> stopped{false};
    std::atomic<bool> posted{false};  // a tick is in the loop's queue
  };
  std::shared_ptr<State> state_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // under mu_
  std::thread thread_;
};

// Only for coroutines of one loop thread. Lock() waits while another coroutine holds it; waiters get the lock in the
// order they asked, and Unlock() hands it to the first of them only (waking every waiter on each unlock would cost
// O(N^2) wake-ups when N results and polls queue on one job's mutex).
class LoopMutex {
 public:
  explicit LoopMutex(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}
  Awaitable<void> Lock() {
    if (!locked_) {
      locked_ = true;
      co_return;
    }
    Turn turn(executor_);
    turn.position = queue_.insert(queue_.end(), &turn);
    // If this coroutine is destroyed while it waits (the loop torn down), it leaves the queue, or passes on a lock
    // handed to it that it never took.
    struct Leave {
      LoopMutex& mutex;
      Turn& turn;
      bool taken = false;
      ~Leave() {
        if (!turn.granted) {
          mutex.queue_.erase(turn.position);
        } else if (!taken) {
          mutex.Unlock();
        }
      }
    } leave{*this, turn};
    // The timeout only guards the loop; Unlock() notifies the turn it grants.
    while (!turn.granted) co_await turn.granted_signal.Wait(std::chrono::hours(1));
    leave.taken = true;  // locked_ stayed true: the lock passed straight from the last holder
  }
  void Unlock() {
    if (queue_.empty()) {
      locked_ = false;
      return;
    }
    Turn* next = queue_.front();
    queue_.pop_front();
    next->granted = true;
    next->granted_signal.Notify();
  }

 private:
  struct Turn {
    explicit Turn(const boost::asio::any_io_executor& executor) : granted_signal(executor) {}
    Signal granted_signal;
    bool granted = false;
    std::list<Turn*>::iterator position;
  };
  boost::asio::any_io_executor executor_;
  bool locked_ = false;
  std::list<Turn*> queue_;  // coroutines waiting for the lock, first come first served
};

// Unlocks on scope exit (also when the coroutine frame is destroyed).
class LoopLock {
 public:
  explicit LoopLock(LoopMutex& mutex) : mutex_(&mutex) {}
  ~LoopLock() {
    if (mutex_ != nullptr) mutex_->Unlock();
  }
  LoopLock(const LoopLock&) = delete;
  LoopLock& operator=(const LoopLock&) = delete;

 private:
  LoopMutex* mutex_;
};

// A value computed on the pool at most once per `max_age` and shared by every caller meanwhile: open routes that
// would otherwise cost store requests on every call (/readyz's probes, /metrics' gauges). A caller that arrives while
// it is being computed waits for that computation rather than starting another. On the loop only.
template <typename T>
class SharedForAWhile {
 public:
  SharedForAWhile(boost::asio::any_io_executor executor, std::chrono::milliseconds max_age)
      : mutex_(std::move(executor)), max_age_(max_age) {}
  // `compute` (T(), run on `pool`) when the value is older than max_age or there is none yet.
  template <typename Fn>
  Awaitable<T> Get(boost::asio::thread_pool& pool, const Clock& clock, Fn compute) {
    co_await mutex_.Lock();
    LoopLock lock(mutex_);
    if (!value_ || clock.Now() - computed_at_ >= max_age_) {
      auto computed = Offload(pool, std::move(compute));  // kCoAwaitTemporaries
      value_ = co_await std::move(computed);
      computed_at_ = clock.Now();
    }
    co_return *value_;
  }

 private:
  LoopMutex mutex_;
  const std::chrono::milliseconds max_age_;
  std::optional<T> value_;
  Clock::TimePoint computed_at_{};
};

}  // namespace parsyn::loop
