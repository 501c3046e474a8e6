// GET /api/v1/events, the dashboard's stream across jobs, against a real `parsyn server` with scripted workers:
// job, round and worker changes arrive; a client resuming with Last-Event-ID gets exactly the events it missed; the
// admin key is required; each project's stream carries its own workers' changes and none of another project's.
#include <gtest/gtest.h>

#include <mutex>

#include "harness.h"

namespace parsyn::testing {
namespace {

constexpr auto kWait = std::chrono::seconds(60);

struct Seen {
  std::string id;
  std::string type;
  json data;
  bool operator==(const Seen&) const = default;
};

// Reads GET /api/v1/events (from `last_event_id` when set) on its own thread until `done` accepts what was seen, the
// stream ends or `kWait` passes.
class EventReader {
 public:
  // `path`: the stream's, with its query (the project).
  EventReader(const ServerProcess& server, std::string last_event_id,
              std::function<bool(const std::vector<Seen>&)> done, std::string path = "/api/v1/events")
      : client_(AdminClient(server)) {
    thread_ = std::jthread([this, last_event_id, path, done = std::move(done)](std::stop_token stop) {
      http::CallOptions call;
      call.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kWait);
      call.stop = stop;
      if (!last_event_id.empty()) call.headers.emplace_back("Last-Event-ID", last_event_id);
      // The read ends when `done` holds, at the stop or at the timeout: what it saw is what the tests check.
      [[maybe_unused]] Status ended = client_->ReadEvents(
          path,
          [&](const http::SseEvent& e) {
            std::lock_guard lock(mu_);
            seen_.push_back({e.id, e.event, json::parse(e.data, nullptr, false)});
            return !done(seen_);
          },
          call);
      std::lock_guard lock(mu_);
      finished_ = true;
    });
  }
  // What it saw so far.
  std::vector<Seen> Snapshot() {
    std::lock_guard lock(mu_);
    return seen_;
  }
  // Waits for the reader to finish, then returns every event it saw.
  std::vector<Seen> Join() {
    thread_.join();
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  std::unique_ptr<http::Client> client_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  bool finished_ = false;
  std::jthread thread_;
};

bool HasEvent(const std::vector<Seen>& seen, const std::function<bool(const Seen&)>& pred) {
  return std::any_of(seen.begin(), seen.end(), pred);
}

// The state of worker `id` after every "workers" event in `seen`: its fields merged in order.
json WorkerState(const std::vector<Seen>& seen, int64_t id) {
  json state = json::object();
  for (const Seen& e : seen) {
    if (e.type != "workers") continue;
    for (const json& w : e.data["workers"]) {
      if (w["id"] == id) state.update(w);
    }
  }
  return state;
}

TEST(EventsTest, JobRoundAndWorkerChangesArriveAndLastEventIdResumesExactly) {
  TempDir dir;
  ServerProcess server(dir.path() / "data");
  auto admin = AdminClient(server);

  // One stream from before anything exists, until the job has ended and both workers are idle again.
  int64_t job_id = -1;
  std::mutex job_mu;
  auto job_over_and_workers_idle = [&](const std::vector<Seen>& seen) {
    std::lock_guard lock(job_mu);
    if (job_id < 0) return false;
    bool over = HasEvent(seen, [&](const Seen& e) {
      return e.type == "job_status" && e.data["job_id"] == job_id && e.data["status"] == "succeeded";
    });
    return over && WorkerState(seen, 1).value("status", "") == "online" &&
           WorkerState(seen, 2).value("status", "") == "online" && WorkerState(seen, 1)["current_job_id"].is_null() &&
           WorkerState(seen, 2)["current_job_id"].is_null();
  };
  auto first = std::make_unique<EventReader>(server, "", job_over_and_workers_idle);

  Fixture f = MakeFixture(*admin, 40, 2);
  ASSERT_EQ(f.worker_ids, (std::vector<int64_t>{1, 2}));
  std::vector<std::unique_ptr<ScriptedWorker>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<ScriptedWorker>(server, f.worker_ids[i], f.worker_tokens[i]));
    workers.back()->Start();
  }
  ASSERT_TRUE(WaitForWorkersOnline(*admin, f.worker_ids, std::chrono::seconds(10)));
  auto created = admin->PostJson("/api/v1/training-jobs", DistributedSpec(f, 2, 2, 20));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  {
    std::lock_guard lock(job_mu);
    job_id = (*created->Json())["id"];
  }
  std::vector<Seen> seen = first->Join();
  for (auto& w : workers) w->Stop();
  ASSERT_TRUE(job_over_and_workers_idle(seen)) << "the stream ended early; saw " << seen.size() << " events";

  // A new client starts with a reset (re-read the lists), whose id is the feed's position then.
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen[0].type, "reset");
  EXPECT_EQ(seen[0].data["reason"], "new");
  const std::string epoch = seen[0].data["epoch"];
  EXPECT_EQ(seen[0].id, epoch + "-0");
  // Ids are consecutive in one epoch.
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i].id, epoch + "-" + std::to_string(i)) << i;

  // Workers: registered (with name and kind), then online with their device, busy on the job, online again.
  EXPECT_TRUE(HasEvent(seen, [](const Seen& e) {
    if (e.type != "workers") return false;
    for (const json& w : e.data["workers"]) {
      if (w["id"] == 1 && w.contains("name") && w["kind"] == "own") return true;
    }
    return false;
  }));
  EXPECT_EQ(WorkerState(seen, 2)["name"], "w1");
  // Busy and online again may fall in one batch of a second: only the latest state is sent, never each change.
  // Job and rounds, in order, with the fields the Training page shows.
  std::vector<std::string> job_events;
  for (const Seen& e : seen) {
    if (e.type == "workers" || e.type == "reset" || e.type == "worker_progress" || e.type == "job_live") continue;
    ASSERT_EQ(e.data["job_id"], job_id) << e.type;
    EXPECT_TRUE(e.data.contains("time_ms")) << e.type;
    std::string text = e.type;
    if (e.data.contains("status")) text += ":" + e.data["status"].get<std::string>();
    if (e.data.contains("round")) text += ":" + std::to_string(e.data["round"].get<int>());
    job_events.push_back(text);
  }
  EXPECT_EQ(job_events, (std::vector<std::string>{"job_created:queued", "job_status:queued", "job_status:running",
                                                  "round_started:1", "round_committed:1", "round_started:2",
                                                  "round_committed:2", "job_status:succeeded"}));
  for (const Seen& e : seen) {
    if (e.type == "job_created") {
      EXPECT_EQ(e.data["name"], DistributedSpec(f, 2, 2, 20)["name"]);
      EXPECT_EQ(e.data["total_rounds"], 2);
      EXPECT_EQ(e.data["spec"]["distributed"]["min_workers"], 2);
    }
    if (e.type == "round_started") {
      EXPECT_EQ(e.data["total_rounds"], 2);
      EXPECT_FALSE(e.data.contains("participants"));  // job_live counts them: not 10,000 ids
    }
    if (e.type == "round_committed") {
      EXPECT_EQ(e.data["total_rounds"], 2);
    }
    if (e.type == "job_status" && e.data["status"] == "succeeded") {
      EXPECT_EQ(e.data["committed_round"], 2);
    }
  }

  // Resuming after the job_created event: exactly the events the first stream saw after it, no reset, same ids.
  size_t resume_at = 0;
  while (resume_at < seen.size() && seen[resume_at].type != "job_created") ++resume_at;
  ASSERT_LT(resume_at, seen.size());
  const std::string last_id = seen.back().id;
  EventReader resumed(server, seen[resume_at].id,
                      [&](const std::vector<Seen>& got) { return got.back().id == last_id; });
  std::vector<Seen> replay = resumed.Join();
  EXPECT_EQ(replay, std::vector<Seen>(seen.begin() + static_cast<std::ptrdiff_t>(resume_at) + 1, seen.end()));

  // An id of another coordinator process (a restart, a failover): a reset, then live events.
  EventReader other(server, "0123456789abcdef-5", [](const std::vector<Seen>&) { return true; });
  std::vector<Seen> reset = other.Join();
  ASSERT_EQ(reset.size(), 1u);
  EXPECT_EQ(reset[0].type, "reset");
  EXPECT_EQ(reset[0].data["reason"], "unknown_id");
  EXPECT_EQ(reset[0].id.substr(0, epoch.size() + 1), epoch + "-");  // the position to resume from next time
}

TEST(EventsTest, NeedsTheAdminKeyAndWellFormedIdsAndSummarisesAWaitingJob) {
  TempDir dir;
  ServerProcess server(dir.path() / "data");
  auto admin = AdminClient(server);
  Fixture f = MakeFixture(*admin, 10, 1);
  auto read_first = [&](http::Client& client, std::vector<std::pair<std::string, std::string>> headers) {
    http::CallOptions call;
    call.timeout = std::chrono::milliseconds(15'000);
    call.headers = std::move(headers);
    return client.ReadEvents(
        "/api/v1/events", [](const http::SseEvent&) { return false; }, call);
  };
  Status no_key = read_first(*ClientWithToken(server, ""), {});
  EXPECT_NE(no_key.message().find("HTTP 401"), std::string::npos) << no_key.ToString();
  Status wrong_key = read_first(*ClientWithToken(server, "pak_wrong"), {});
  EXPECT_NE(wrong_key.message().find("HTTP 401"), std::string::npos) << wrong_key.ToString();
  Status worker_token = read_first(*ClientWithToken(server, f.worker_tokens[0]), {});
  EXPECT_NE(worker_token.message().find("HTTP 401"), std::string::npos) << worker_token.ToString();
  Status malformed = read_first(*admin, {{"Last-Event-ID", "12"}});
  EXPECT_NE(malformed.message().find("HTTP 400"), std::string::npos) << malformed.ToString();
  EXPECT_NE(malformed.message().find("Last-Event-ID must be an id this stream sent"), std::string::npos)
      << malformed.ToString();
  EXPECT_TRUE(read_first(*admin, {}).ok());

  // A job waiting for its worker (not started): its live summary comes as job_live, then the cancel as job_status.
  auto job_live_then_cancelled = [](const std::vector<Seen>& seen) {
    return HasEvent(seen, [](const Seen& e) { return e.type == "job_status" && e.data["status"] == "cancelled"; });
  };
  EventReader reader(server, "", job_live_then_cancelled);
  auto created = admin->PostJson("/api/v1/training-jobs", DistributedSpec(f, 1, 1, 20));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const int64_t job_id = (*created->Json())["id"];
  // Cancelled once the stream showed the job's live summary.
  bool live_seen = false;
  for (int i = 0; i < 600 && !live_seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    live_seen = HasEvent(reader.Snapshot(), [](const Seen& e) { return e.type == "job_live"; });
  }
  ASSERT_TRUE(live_seen) << "no job_live event";
  auto cancel = admin->PostJson("/api/v1/training-jobs/" + std::to_string(job_id) + "/cancel", json::object());
  ASSERT_TRUE(cancel.ok()) << cancel.status().ToString();
  std::vector<Seen> seen = reader.Join();
  ASSERT_TRUE(job_live_then_cancelled(seen));
  size_t live_at = 0;
  while (live_at < seen.size() && seen[live_at].type != "job_live") ++live_at;
  ASSERT_LT(live_at, seen.size());
  EXPECT_EQ(seen[live_at].data["job_id"], job_id);
  EXPECT_EQ(seen[live_at].data["active_workers"], 0);
  EXPECT_TRUE(seen[live_at].data["phase"].is_string()) << seen[live_at].data.dump();
}

// Each stream is its project's: a worker registered in vision shows in vision's stream only, one of the default
// project in the default one's only. Each stream is read until a change of a later batch (workers' changes go out
// once a second) than the other project's first.
TEST(EventsTest, AProjectsStreamCarriesNoneOfAnotherProjectsChanges) {
  TempDir dir;
  ServerProcess server(dir.path() / "data");
  auto admin = AdminClient(server);
  ASSERT_TRUE(admin->PostJson("/api/v1/projects", {{"name", "vision"}}).ok());
  std::mutex mu;
  std::map<std::string, int64_t> ids;  // the readers' threads read it
  auto add = [&](const std::string& name, const std::string& project) {
    StatusOr<http::ClientResponse> w = admin->PostJson("/api/v1/workers?project=" + project, {{"name", name}});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::lock_guard lock(mu);
    ids[name] = (*w->Json())["id"].get<int64_t>();
  };
  auto has_worker = [&](const std::vector<Seen>& seen, const std::string& name) {
    std::lock_guard lock(mu);
    return ids.count(name) && !WorkerState(seen, ids.at(name)).empty();
  };
  EventReader in_vision(
      server, "", [&](const std::vector<Seen>& seen) { return has_worker(seen, "vision-2"); },
      "/api/v1/events?project=vision");
  EventReader in_default(server, "", [&](const std::vector<Seen>& seen) { return has_worker(seen, "default-2"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both streams open
  add("vision-1", "vision");
  add("default-1", "default");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the next batch
  add("vision-2", "vision");
  add("default-2", "default");
  const std::vector<Seen> vision = in_vision.Join();
  const std::vector<Seen> default_project = in_default.Join();
  EXPECT_TRUE(has_worker(vision, "vision-1"));
  EXPECT_TRUE(has_worker(vision, "vision-2"));
  EXPECT_FALSE(has_worker(vision, "default-1"));
  EXPECT_TRUE(has_worker(default_project, "default-1"));
  EXPECT_TRUE(has_worker(default_project, "default-2"));
  EXPECT_FALSE(has_worker(default_project, "vision-1"));
}

}  // namespace
}  // namespace parsyn::testing
