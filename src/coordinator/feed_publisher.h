// FeedPublisher: what the service puts on the dashboard's one stream (EventFeed, GET /api/v1/events): the job events
// the dashboard shows (worker progress as a sample), worker changes batched into one "workers" event per batch, and a
// "job_live" summary per job with events since the last batch (PublishBatches, every
// ServiceOptions::event_batch_interval). It never sends one event per heartbeat.
//
// Threads: the service's event loop only (no locks), like the EventFeed it publishes on.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "base/clock.h"
#include "coordinator/event_feed.h"

namespace parsyn::coordinator {

class FeedPublisher {
 public:
  // The feed's bounds and the progress sampling (ServiceOptions' event_* and progress_* fields say what each does).
  struct Options {
    size_t buffer_events = 4096;
    size_t buffer_bytes = size_t{8} << 20;
    std::chrono::milliseconds progress_sample_interval{5'000};
    int progress_samples_per_second = 20;
  };

  FeedPublisher(boost::asio::any_io_executor executor, const Clock& clock, const Options& options);

  // The stream itself, which GET /api/v1/events reads.
  EventFeed& feed() { return feed_; }
  // Publishes an event of project `project_id` (0: every project's streams) now; adds "time_ms" to `data`.
  void Publish(std::string type, nlohmann::json data, int64_t project_id = 0);
  // Merges `fields` (a worker's view, or the fields of it that changed) into the worker's entry of the next
  // "workers" event of its project (`project_id`; 0 for a managed worker: every project's) (sent by PublishBatches).
  void NoteWorkerChange(int64_t worker_id, int64_t project_id, const nlohmann::json& fields);
  // A job event of the ones the dashboard's stream carries goes there too (worker progress as a sample), to the
  // streams of the job's project.
  void ForwardJobEvent(int64_t job_id, int64_t project_id, const std::string& type, const nlohmann::json& payload);

  // A job's live summary (JobRunner::LiveSummary); nullopt when the job has no runner or its runner finished (its
  // terminal job_status says it all).
  using LiveSummary = std::function<std::optional<nlohmann::json>(int64_t job_id)>;
  // Sends the worker changes noted since the last call as one "workers" event, and a "job_live" event for each job
  // with events since the last call (every event_batch_interval).
  void PublishBatches(const LiveSummary& live_summary);

 private:
  const Clock& clock_;
  const Options options_;
  EventFeed feed_;
  // project -> worker id -> fields changed since the last "workers" event
  std::map<int64_t, std::map<int64_t, nlohmann::json>> worker_changes_;
  std::map<int64_t, int64_t> jobs_live_changed_;  // job -> its project: jobs with events since the last "job_live"
  std::map<int64_t, Clock::TimePoint> progress_sampled_at_;  // per worker: its last progress sent to the feed
  Clock::TimePoint progress_window_start_{};
  int progress_in_window_ = 0;
};

}  // namespace parsyn::coordinator
