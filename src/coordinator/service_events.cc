// The service's event plumbing: job events queued with their job's writes (group commit) and, once stored, woken
// job streams and the dashboard's feed (GET /api/v1/events), with worker progress sampled and worker changes batched.
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
    for (const QueuedEvent& e : events) ForwardToFeed(job_id, e.type, e.payload);
  };
  return writes_->Queue(std::move(records), std::move(on_applied));
}

void Service::PublishFeedEvent(std::string type, json data) {
  data["time_ms"] = clock_.UnixMillis();
  feed_.Publish(std::move(type), data.dump());
}

void Service::ForwardToFeed(int64_t job_id, const std::string& type, const json& payload) {
  if (type != "worker_progress") jobs_live_changed_.insert(job_id);
  if (type == "worker_progress") {
    // A sample: the job's own stream has every report; the dashboard's lists need no more than this.
    const Clock::TimePoint now = clock_.Now();
    const int64_t worker_id = payload.value("worker_id", int64_t{0});
    auto [sampled, first] = progress_sampled_at_.try_emplace(worker_id, now);
    if (!first && now - sampled->second < options_.progress_sample_interval) return;
    if (now - progress_window_start_ >= std::chrono::seconds(1)) {
      progress_window_start_ = now;
      progress_in_window_ = 0;
    }
    if (progress_in_window_ >= options_.progress_samples_per_second) return;
    progress_in_window_++;
    sampled->second = now;
  } else if (type != "job_status" && type != "round_started" && type != "round_committed" && type != "round_failed") {
    return;  // per-worker detail of a round (tasks, updates, drops): the job's own stream has it; job_live sums it up
  }
  json data = payload;
  // Who was chosen at the start is a partial list (later arrivals get tasks after), and 10,000 ids are a large
  // event: job_live carries the count of workers in the round instead.
  data.erase("participants");
  data["job_id"] = job_id;
  PublishFeedEvent(type, std::move(data));
}

void Service::NoteWorkerChange(int64_t worker_id, const json& fields) {
  json& entry = worker_changes_[worker_id];
  if (!entry.is_object()) entry = json::object();
  entry.update(fields);
  entry["id"] = worker_id;
}

void Service::PublishBatches() {
  if (!worker_changes_.empty()) {
    json workers = json::array();
    for (auto& [id, fields] : worker_changes_) workers.push_back(std::move(fields));
    worker_changes_.clear();
    PublishFeedEvent("workers", {{"workers", std::move(workers)}});
  }
  const std::set<int64_t> jobs = std::exchange(jobs_live_changed_, {});
  for (int64_t job_id : jobs) {
    JobRunner* runner = FindRunner(job_id);
    if (runner == nullptr || runner->finished()) continue;  // its terminal job_status says it all
    json data = runner->LiveSummary();
    if (!data.contains("phase")) continue;
    data["job_id"] = job_id;
    PublishFeedEvent("job_live", std::move(data));
  }
}

}  // namespace parsyn::coordinator
