// Streaming an HTTP request body into a blocking consumer on the pool (BlobStore::Put) with bounded memory:
//   - BodyPipe: a ByteSource a pool thread reads while a loop coroutine feeds it the body chunk by chunk.
//   - DirectBodySource: a ByteSource over a body a pool thread receives straight from the socket.
//   - StreamBodyInto: picks one of the two and returns the consumer's result.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "http/server.h"
#include "loop/loop_tools.h"
#include "loop/signal.h"
#include "storage/byte_source.h"

namespace parsyn::coordinator {

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
    auto received = loop::Offload(pool, [source, put = std::move(put)] { return put(*source); });
    co_return co_await std::move(received);
  }
  struct Shared {
    explicit Shared(const boost::asio::any_io_executor& ex) : done(ex), drained(ex) {}
    loop::Signal done;     // notified on the loop once `result` is set
    loop::Signal drained;  // notified on the loop when the pipe has room again
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
