// WriteQueue: group commit of the coordinator's per-worker records (docs/architecture.md §3, "Group commit").
//
// Callers on the event loop queue writes (a task's shard assignment and event, a result's update record and event,
// a progress event, ...) and get a ticket; one flusher turns everything queued into ONE MetadataStore::ApplyBatch on
// the pool (one transaction, one fsync), and whatever is queued meanwhile forms the next batch. So K workers' writes
// cost a few commits instead of K, while each caller still answers only once its writes are durable (Wait).
//
// Order: batches are applied one at a time, in queue order, so writes land in the order they were queued. A batch is
// all or nothing: when it fails, every ticket in it gets its error (the callers handle it as they would a failed
// single write).
//
// Threads: loop thread only (the store is called on the pool).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "http/server.h"
#include "loop/signal.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

class WriteQueue {
 public:
  // One caller's writes: done once their batch was applied (status: OK, or the batch's error).
  struct Ticket {
    explicit Ticket(boost::asio::any_io_executor executor) : applied(std::move(executor)) {}
    bool done = false;
    Status status;
    std::vector<int64_t> event_ids;  // of the writes' events, in order (when OK)
    loop::Signal applied;
  };
  using TicketPtr = std::shared_ptr<Ticket>;

  WriteQueue(boost::asio::any_io_executor loop, boost::asio::thread_pool& pool, storage::MetadataStore& store);
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues `writes` for the next batch. `on_applied` (optional) runs on the loop when their batch is done, before
  // waiters resume, with the ticket (e.g. to wake event streams).
  TicketPtr Queue(std::vector<storage::BatchWrite> writes, std::function<void(const Ticket&)> on_applied = {});
  // Until the ticket's batch is done: its status.
  static http::Awaitable<Status> Wait(TicketPtr ticket);

  // Batches applied so far (each one commit), and writes in them: for tests and /metrics.
  int64_t batches() const { return batches_; }
  int64_t writes() const { return writes_; }

 private:
  struct Entry {
    std::vector<storage::BatchWrite> writes;
    std::function<void(const Ticket&)> on_applied;
    TicketPtr ticket;
  };
  http::Awaitable<void> Flush();

  boost::asio::any_io_executor loop_;
  boost::asio::thread_pool& pool_;
  storage::MetadataStore& store_;
  std::vector<Entry> queued_;
  bool flushing_ = false;
  int64_t batches_ = 0;
  int64_t writes_ = 0;
};

}  // namespace parsyn::coordinator
