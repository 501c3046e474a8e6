// The service's event plumbing: job events queued with their job's writes (group commit) and, once stored, woken
// job streams and the dashboard's feed (GET /api/v1/events, FeedPublisher: worker progress sampled, worker changes
// batched).
#include "coordinator/service.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include "base/log.h"
#include "coordinator/job_runner.h"

namespace parsyn::coordinator {

using nlohmann::json;

loop::Signal& Service::EventSignal(int64_t job_id) {
  std::unique_ptr<loop::Signal>& s = event_signals_[job_id];
  if (!s) s = std::make_unique<loop::Signal>(io_.get_executor());
  return *s;
}

http::Awaitable<void> Service::AppendEvent(int64_t job_id, std::string type, json payload) {
  std::vector<QueuedEvent> events;
  events.push_back(QueuedEvent{std::move(type), std::move(payload)});
  WriteQueue::TicketPtr ticket = QueueJobWrites(job_id, {}, std::move(events));
  auto applied = WriteQueue::Wait(ticket);  // kCoAwaitTemporaries
  co_await std::move(applied);
}

WriteQueue::TicketPtr Service::QueueJobWrites(int64_t job_id, std::vector<storage::BatchWrite> records,
                                              std::vector<QueuedEvent> events) {
  const int64_t now = clock_.UnixMillis();
  for (const QueuedEvent& e : events) {
    records.push_back(
        storage::JobEvent{.job_id = job_id, .type = e.type, .payload_json = e.payload.dump(), .time_ms = now});
  }
  auto on_applied = [this, job_id, events = std::move(events)](const WriteQueue::Ticket& t) {
    if (events.empty()) return;
    if (!t.status.ok()) {
      PARSYN_LOG_ERROR("training job {}: {} event(s) ({}, ...) not stored: {}", job_id, events.size(),
                       events.front().type, t.status.ToString());
    }
    EventSignal(job_id).Notify();
    const JobRunner* runner = FindRunner(job_id);
    const int64_t project_id = runner != nullptr ? runner->project_id() : 0;
    for (const QueuedEvent& e : events) feed_.ForwardJobEvent(job_id, project_id, e.type, e.payload);
  };
  return writes_->Queue(std::move(records), std::move(on_applied));
}

void Service::PublishBatches() {
  feed_.PublishBatches([this](int64_t job_id) -> std::optional<json> {
    JobRunner* runner = FindRunner(job_id);
    if (runner == nullptr || runner->finished()) return std::nullopt;  // its terminal job_status says it all
    return runner->LiveSummary();
  });
}

}  // namespace parsyn::coordinator
