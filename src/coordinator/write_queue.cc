#include "coordinator/write_queue.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <chrono>

#include "loop/loop_tools.h"

namespace parsyn::coordinator {

WriteQueue::WriteQueue(boost::asio::any_io_executor loop, boost::asio::thread_pool& pool, storage::MetadataStore& store)
    : loop_(std::move(loop)), pool_(pool), store_(store) {}

WriteQueue::TicketPtr WriteQueue::Queue(std::vector<storage::BatchWrite> writes,
                                        std::function<void(const Ticket&)> on_applied) {
  auto ticket = std::make_shared<Ticket>(loop_);
  queued_.push_back(Entry{std::move(writes), std::move(on_applied), ticket});
  if (!flushing_) {
    flushing_ = true;
    boost::asio::co_spawn(loop_, Flush(), boost::asio::detached);
  }
  return ticket;
}

http::Awaitable<Status> WriteQueue::Wait(TicketPtr ticket) {
  // The timeout only guards against a notification between the check and the wait (there is none on one thread).
  while (!ticket->done) co_await ticket->applied.Wait(std::chrono::seconds(1));
  co_return ticket->status;
}

http::Awaitable<void> WriteQueue::Flush() {
  while (!queued_.empty()) {
    // Everything queued so far is one batch; what arrives while it is applied waits for the next.
    std::vector<Entry> batch;
    batch.swap(queued_);
    std::vector<storage::BatchWrite> writes;
    for (Entry& e : batch) {
      for (storage::BatchWrite& w : e.writes) writes.push_back(std::move(w));
    }
    StatusOr<std::vector<int64_t>> applied = co_await loop::Offload(pool_, [&] { return store_.ApplyBatch(writes); });
    batches_++;
    writes_ += static_cast<int64_t>(writes.size());
    size_t next_event = 0;
    for (Entry& e : batch) {
      Ticket& t = *e.ticket;
      t.status = applied.status();
      if (applied.ok()) {
        for (const storage::BatchWrite& w : e.writes) {
          // The entry's writes were moved into the batch; their kinds are still there to count its events.
          if (std::holds_alternative<storage::JobEvent>(w) && next_event < applied->size()) {
            t.event_ids.push_back((*applied)[next_event++]);
          }
        }
      }
      t.done = true;
      if (e.on_applied) e.on_applied(t);
      t.applied.Notify();
    }
  }
  flushing_ = false;
}

}  // namespace parsyn::coordinator
