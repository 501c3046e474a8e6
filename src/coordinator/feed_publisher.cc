#include "coordinator/feed_publisher.h"

namespace parsyn::coordinator {

using nlohmann::json;

FeedPublisher::FeedPublisher(boost::asio::any_io_executor executor, const Clock& clock, const Options& options)
    : clock_(clock),
      options_(options),
      feed_(std::move(executor), NewFeedEpoch(), options.buffer_events, options.buffer_bytes) {}

void FeedPublisher::Publish(std::string type, json data, int64_t project_id) {
  data["time_ms"] = clock_.UnixMillis();
  feed_.Publish(std::move(type), data.dump(), project_id);
}

void FeedPublisher::ForwardJobEvent(int64_t job_id, int64_t project_id, const std::string& type, const json& payload) {
  if (type != "worker_progress") jobs_live_changed_[job_id] = project_id;
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
  Publish(type, std::move(data), project_id);
}

void FeedPublisher::NoteWorkerChange(int64_t worker_id, int64_t project_id, const json& fields) {
  json& entry = worker_changes_[project_id][worker_id];
  if (!entry.is_object()) entry = json::object();
  entry.update(fields);
  entry["id"] = worker_id;
}

void FeedPublisher::PublishBatches(const LiveSummary& live_summary) {
  for (auto& [project_id, changes] : std::exchange(worker_changes_, {})) {
    json workers = json::array();
    for (auto& [id, fields] : changes) workers.push_back(std::move(fields));
    Publish("workers", {{"workers", std::move(workers)}}, project_id);
  }
  const std::map<int64_t, int64_t> jobs = std::exchange(jobs_live_changed_, {});
  for (const auto& [job_id, project_id] : jobs) {
    std::optional<json> data = live_summary(job_id);
    if (!data || !data->contains("phase")) continue;
    (*data)["job_id"] = job_id;
    Publish("job_live", std::move(*data), project_id);
  }
}

}  // namespace parsyn::coordinator
