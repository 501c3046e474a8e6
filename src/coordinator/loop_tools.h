// Tools for code on the coordinator's event loop (one io_context thread, docs/architecture.md §3):
//   - Offload: run a blocking call (store, hashing, aggregation) on the worker pool and resume on the loop with its
//     result, so the loop never blocks.
//   - LoopMutex: an async mutex for coroutines of the one loop thread (a job's events are handled one at a time
//     while their actions await the pool).
//   - SharedForAWhile: a value computed at most once per max_age, shared by the callers meanwhile.
//   - BodyPipe: a ByteSource a pool thread reads (BlobStore::Put) while a loop coroutine feeds it an HTTP request
//     body chunk by chunk, so uploads stream into the blob store with bounded memory.
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
#include <deque>
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
#include "http/server.h"
#include "http/signal.h"
#include "storage/byte_source.h"

namespace parsyn::coordinator {

// kCoAwaitTemporaries: g++ 12 destroys some temporaries of a co_await expression twice (double frees seen with
// std::function, std::string and lambdas holding shared_ptrs). Code here therefore never puts a temporary with a
// destructor inside a co_await: it creates the awaitable first, `auto op = f(args); co_await std::move(op);`, so
// the arguments are copied into the coroutine's frame by an ordinary statement.

// Runs `fn` on `pool` and resumes the awaiting coroutine on its own executor (the loop) with fn's result.
// `fn` must not touch loop state; it may capture references that outlive the co_await.
template <typename Fn>
http::Awaitable<std::invoke_result_t<Fn>> Offload(boost::asio::thread_pool& pool, Fn fn) {
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
http::Awaitable<void> YieldToLoop();
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
  http::Awaitable<void> Lock() {
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
    http::Signal granted_signal;
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
  http::Awaitable<T> Get(boost::asio::thread_pool& pool, const Clock& clock, Fn compute) {
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

// A bounded single-producer (loop) single-consumer (pool thread) byte channel. Thread-safe.
class BodyPipe final : public storage::ByteSource {
 public:
  // `on_drained` is called on the consumer's thread whenever a read makes a full pipe no longer full.
  explicit BodyPipe(std::function<void()> on_drained, size_t max_buffered_bytes = 4 << 20)
      : on_drained_(std::move(on_drained)), max_buffered_bytes_(max_buffered_bytes) {}

  // Consumer side (pool thread): blocks until bytes, the end, or an error.
  StatusOr<size_t> Read(std::span<std::byte> buffer) override;

  // Producer side. Push returns false once the consumer has gone (Abandon()).
  bool Push(std::string_view chunk);
  void Close();             // the body is complete
  void Fail(Status error);  // the body broke; the consumer's Read returns `error`
  void Abandon();           // the consumer stopped reading; pushes are dropped
  bool Full() const;        // the producer should wait (for on_drained) before pushing more

 private:
  const std::function<void()> on_drained_;
  const size_t max_buffered_bytes_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::string> chunks_;
  size_t offset_in_front_ = 0;
  size_t buffered_bytes_ = 0;
  bool closed_ = false;
  bool abandoned_ = false;
  Status error_;
};

// A ByteSource over a body that a pool thread receives straight from the socket (http::BodyReader::TakeDirect).
class DirectBodySource final : public storage::ByteSource {
 public:
  explicit DirectBodySource(std::shared_ptr<http::DirectBody> body) : body_(std::move(body)) {}
  StatusOr<size_t> Read(std::span<std::byte> buffer) override {
    return body_->Read(std::span<char>(reinterpret_cast<char*>(buffer.data()), buffer.size()));
  }

 private:
  std::shared_ptr<http::DirectBody> body_;
};

// Streams `body` into `put` (a blocking call that reads it, run on `pool`) and returns put's result. Where the server
// allows (plain TCP, a Content-Length body), `put` receives from the socket itself on its pool thread: the bytes are
// hashed and written as they arrive, with no parsing or copy on the loop, and uploads are received by as many threads
// as the pool has. Otherwise (TLS, chunked) the loop reads the body and feeds `put` through a pipe. Body errors (size
// cap, stalled or vanished client) come back as put's error either way.
template <typename R>
http::Awaitable<R> StreamBodyInto(boost::asio::thread_pool& pool, http::BodyReader& body,
                                  std::function<R(storage::ByteSource&)> put) {
  if (std::shared_ptr<http::DirectBody> direct = body.TakeDirect()) {
    auto source = std::make_shared<DirectBodySource>(std::move(direct));
    // The handler waits for the reader (TakeDirect's rule): Offload resumes only once `put` has returned.
    auto received = Offload(pool, [source, put = std::move(put)] { return put(*source); });
    co_return co_await std::move(received);
  }
  struct Shared {
    explicit Shared(const boost::asio::any_io_executor& ex) : done(ex), drained(ex) {}
    http::Signal done;     // notified on the loop once `result` is set
    http::Signal drained;  // notified on the loop when the pipe has room again
    std::optional<R> result;
    std::atomic<bool> finished{false};
  };
  auto executor = co_await boost::asio::this_coro::executor;
  auto shared = std::make_shared<Shared>(executor);
  auto pipe = std::make_shared<BodyPipe>([executor, weak = std::weak_ptr<Shared>(shared)] {
    boost::asio::post(executor, [weak] {
      if (auto s = weak.lock()) s->drained.Notify();
    });
  });
  boost::asio::post(pool, [pipe, shared, put = std::move(put), executor]() {
    shared->result.emplace(put(*pipe));
    pipe->Abandon();
    shared->finished.store(true, std::memory_order_release);
    boost::asio::post(executor, [shared] { shared->done.Notify(); });
  });
  // If this coroutine is destroyed mid-upload (server shutdown), the reader on the pool must not block forever.
  struct FailOnExit {
    BodyPipe* pipe;
    ~FailOnExit() { pipe->Fail(CancelledError("the upload was abandoned")); }
  } fail_on_exit{pipe.get()};
  while (true) {
    StatusOr<std::string_view> chunk = co_await body.Next();
    if (!chunk.ok()) {
      pipe->Fail(chunk.status());
      break;
    }
    if (chunk->empty()) {
      pipe->Close();
      break;
    }
    if (!pipe->Push(*chunk)) break;  // the consumer failed early; its error is the answer
    // The timeout only guards against a lost wake-up between Full() and Wait(); on_drained normally ends the wait.
    while (pipe->Full() && !shared->finished.load(std::memory_order_acquire)) {
      co_await shared->drained.Wait(std::chrono::milliseconds(100));
    }
  }
  while (!shared->finished.load(std::memory_order_acquire)) co_await shared->done.Wait(std::chrono::milliseconds(100));
  co_return std::move(*shared->result);
}

}  // namespace parsyn::coordinator
