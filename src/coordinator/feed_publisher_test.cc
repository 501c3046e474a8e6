// FeedPublisher on its own (FakeClock; the feed's events read back from its ring).
#include "coordinator/feed_publisher.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <vector>

namespace parsyn::coordinator {
namespace {

using nlohmann::json;

struct Published {
  std::string type;
  json data;
};

class FeedPublisherTest : public ::testing::Test {
 protected:
  FeedPublisher::Options Options() {
    return {.buffer_events = 100,
            .buffer_bytes = 1 << 20,
            .progress_sample_interval = std::chrono::seconds(5),
            .progress_samples_per_second = 2};
  }

  // The events published since the last call.
  std::vector<Published> Take() {
    std::vector<FeedEvent> events;
    EXPECT_TRUE(publisher_.feed().After(read_, 100, events));
    std::vector<Published> out;
    for (FeedEvent& e : events) {
      read_ = e.seq;
      out.push_back({e.type, json::parse(e.data)});
    }
    return out;
  }

  static std::optional<json> NoRunner(int64_t) { return std::nullopt; }

  void Progress(int64_t job_id, int64_t worker_id) {
    publisher_.ForwardJobEvent(job_id, 1, "worker_progress", {{"worker_id", worker_id}, {"step", 1}});
  }

  boost::asio::io_context io_;
  FakeClock clock_;
  FeedPublisher publisher_{io_.get_executor(), clock_, Options()};
  uint64_t read_ = 0;
};

TEST_F(FeedPublisherTest, BatchingMergesWorkerChangesIntoOneEvent) {
  publisher_.NoteWorkerChange(2, 0, {{"status", "online"}, {"device", "cpu"}});
  publisher_.NoteWorkerChange(1, 0, {{"status", "online"}});
  publisher_.NoteWorkerChange(2, 0, {{"status", "busy"}, {"current_job_id", 5}});
  EXPECT_TRUE(Take().empty());  // nothing before the batch

  publisher_.PublishBatches(NoRunner);
  std::vector<Published> events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "workers");
  EXPECT_EQ(events[0].data["time_ms"], clock_.UnixMillis());
  EXPECT_EQ(events[0].data["workers"],
            (json::array({{{"id", 1}, {"status", "online"}},
                          {{"id", 2}, {"status", "busy"}, {"device", "cpu"}, {"current_job_id", 5}}})));

  publisher_.PublishBatches(NoRunner);  // no change since: no event
  EXPECT_TRUE(Take().empty());
}

TEST_F(FeedPublisherTest, EventsAreFiledUnderTheirProject) {
  publisher_.NoteWorkerChange(1, 2, {{"status", "online"}});  // an own worker of project 2
  publisher_.NoteWorkerChange(3, 0, {{"status", "online"}});  // a managed worker: every project's
  publisher_.NoteWorkerChange(2, 5, {{"status", "online"}});
  publisher_.ForwardJobEvent(7, 5, "job_status", {{"status", "running"}});
  publisher_.PublishBatches([](int64_t) -> std::optional<json> { return json{{"phase", "training"}}; });
  std::vector<std::pair<std::string, int64_t>> filed;
  std::vector<FeedEvent> events;
  publisher_.feed().After(0, 100, events);
  for (const FeedEvent& e : events) filed.emplace_back(e.type, e.project_id);
  EXPECT_EQ(filed, (std::vector<std::pair<std::string, int64_t>>{
                       {"job_status", 5}, {"workers", 0}, {"workers", 2}, {"workers", 5}, {"job_live", 5}}));
}

TEST_F(FeedPublisherTest, ProgressIsSampledPerWorkerAndCappedPerSecond) {
  Progress(9, 1);
  Progress(9, 1);  // the same worker within progress_sample_interval: not sent
  Progress(9, 2);
  Progress(9, 3);  // a third sample within the second: over progress_samples_per_second
  std::vector<Published> events = Take();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, "worker_progress");
  EXPECT_EQ(events[0].data["worker_id"], 1);
  EXPECT_EQ(events[0].data["job_id"], 9);
  EXPECT_EQ(events[1].data["worker_id"], 2);

  clock_.Advance(std::chrono::seconds(1));
  Progress(9, 4);  // a new second
  Progress(9, 1);  // still within worker 1's interval
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data["worker_id"], 4);

  clock_.Advance(std::chrono::seconds(5));
  Progress(9, 1);
  ASSERT_EQ(Take().size(), 1u);
  // Progress alone makes no job_live summary.
  publisher_.PublishBatches([](int64_t) -> std::optional<json> { return json{{"phase", "training"}}; });
  EXPECT_TRUE(Take().empty());
}

TEST_F(FeedPublisherTest, JobEventsOfTheDashboardGoThereAndTheRestMakeALiveSummary) {
  publisher_.ForwardJobEvent(4, 1, "round_started", {{"round", 2}, {"participants", json::array({1, 2, 3})}});
  publisher_.ForwardJobEvent(5, 1, "task_assigned", {{"round", 1}, {"worker_id", 1}});
  std::vector<Published> events = Take();
  ASSERT_EQ(events.size(), 1u);  // per-worker detail of a round stays in the job's own stream
  EXPECT_EQ(events[0].type, "round_started");
  EXPECT_EQ(events[0].data["job_id"], 4);
  EXPECT_EQ(events[0].data["round"], 2);
  EXPECT_FALSE(events[0].data.contains("participants"));

  // Both jobs had events: a job_live summary each, but only of a runner's summary with a phase.
  std::vector<int64_t> asked;
  publisher_.PublishBatches([&](int64_t job_id) -> std::optional<json> {
    asked.push_back(job_id);
    if (job_id == 4) return json{{"phase", "training"}, {"round", 2}};
    return json{{"round", 1}};
  });
  EXPECT_EQ(asked, (std::vector<int64_t>{4, 5}));
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "job_live");
  EXPECT_EQ(events[0].data["job_id"], 4);
  EXPECT_EQ(events[0].data["phase"], "training");

  publisher_.Publish("job_created", {{"job_id", 6}});
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, (json{{"job_id", 6}, {"time_ms", clock_.UnixMillis()}}));
}

}  // namespace
}  // namespace parsyn::coordinator
