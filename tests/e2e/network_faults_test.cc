// Faults of the network and the disk under a federated tabular job, with real processes: `parsyn server`, `parsyn
// worker`s and their trainers, every worker's traffic (the worker protocol and its signed blob URLs: the server's
// --public-url is the proxy) through one TcpProxy (tcp_proxy.h) whose per-worker links the tests break.
//
// | fault                                                   | expected behaviour                                    |
// | ------------------------------------------------------- | ----------------------------------------------------- |
// | link drops (paused, nothing reset) mid-upload of an     | the worker leaves the round (missed heartbeats); its  |
// |   update for 8 s (a 30 s outage, scaled to these        |   late upload and result count for nothing; it takes  |
// |   tests' 3 s heartbeat timeout and 20 s round timeout)  |   part in a later round                               |
// | link throttled (uploads at 32 KB/s, a ~1 MB update:     | cut at the round's aggregation_timeout (straggler):   |
// |   a 1 MB/s link scaled likewise)                        |   it stops uploading to the round that is over;       |
// |                                                         |   nothing of it counted; rejoins once the link is fast|
// | link cut for good                                       | left out; the round commits with the others           |
// |   (the three above at once, min_workers 2 of 5)         |   (the 2 healthy workers' updates, no others)         |
// | coordinator SIGKILLed while an update upload is in      | the attempt in flight is failed and retried; nothing  |
// |   flight, restarted on the same data directory          |   of the dead attempt is counted; the job completes   |
// | worker SIGKILLed after its upload, before its result    | its stored update is never counted; it rejoins when   |
// |                                                         |   it is back                                          |
// | data directory on a small tmpfs that fills up mid-round | the round fails with "disk full: <path> ..., free     |
// |                                                         |   space and the job resumes"; once space is freed the |
// |                                                         |   round is retried and the job completes; no          |
// |                                                         |   committed round is lost                             |
//
// Every committed round is checked to be the FedAvg of exactly its accepted updates, with no worker counted twice.
// Mounting the tmpfs needs the right to mount (root in a container that allows it); elsewhere that test is skipped,
// saying why, and job_runner_test's DiskFullIsShownWhileItLastsAndRecordedAsTheRoundsFailure covers the coordinator's
// side with an injected disk-full store error.
#include <sys/mount.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "llama_fixture.h"
#include "tcp_proxy.h"

namespace parsyn::e2e {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Every event of a job that has ended (the stream ends with the job): {type, data}.
std::vector<std::pair<std::string, json>> AllEvents(http::Client& admin, int64_t job_id) {
  std::vector<std::pair<std::string, json>> events;
  test_support::WaitForJobEvent(
      admin, job_id,
      [&](const std::string& type, const json& data) {
        events.emplace_back(type, data);
        return false;
      },
      seconds(20), test_support::OnStreamEnd::kGiveUp);
  return events;
}

// Workers whose update a round accepted.
std::set<int64_t> Accepted(const json& round) {
  std::set<int64_t> out;
  for (const json& u : round["updates"]) {
    if (u["status"] == "accepted") out.insert(u["worker_id"].get<int64_t>());
  }
  return out;
}

// A tabular job whose workers all reach the coordinator through one TcpProxy.
class NetworkFaultsTest : public LlamaJobTest {
 protected:
  void SetUp() override {}  // each test starts its own server (some on a file system of their own)
  void TearDown() override {
    if (HasFailure()) {
      std::ifstream in(tmp_.path() / "server.log");
      std::stringstream log;
      log << in.rdbuf();
      const std::string text = log.str();
      std::fprintf(stderr, "---- server (last 6000 bytes) ----\n%s\n",
                   text.substr(text.size() > 6000 ? text.size() - 6000 : 0).c_str());
    }
    LlamaJobTest::TearDown();
  }

  // An MLP of `hidden_sizes` on 400 rows, the server on `data_dir` behind the proxy.
  void StartServer(const std::string& hidden_sizes, const fs::path& data_dir) {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(400, hidden_sizes));
    port_ = FreePort();
    proxy_ = std::make_unique<TcpProxy>(port_);
    // --keep-updates: the tests look for a round's update files after it ended.
    server_ = std::make_unique<Server>(data_dir, port_,
                                       std::vector<std::string>{"--public-url", proxy_->url(), "--keep-updates"});
    server_->Start();
    admin_ = server_->Admin();
    model_id_ = UploadModel(*admin_, tmp_.path() / "model", "points-mlp");
    dataset_id_ = UploadDataset(*admin_, tmp_.path() / "points.csv");
    ASSERT_GT(model_id_, 0);
    ASSERT_GT(dataset_id_, 0);
  }

  // Registers and starts `n` workers whose --server is the proxy, each on its own link; returns their ids.
  std::vector<int64_t> StartLinkedWorkers(int n) {
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) {
      const std::string name = "w" + std::to_string(workers_.size());
      Registered r = RegisterWorker(*admin_, name);
      ids.push_back(r.id);
      workers_.push_back(std::make_unique<Worker>(proxy_->url(), r.token, name, tmp_.path() / ("cache-" + name)));
      workers_.back()->Start();
      proxy_->Track(workers_.back()->pid());
    }
    EXPECT_TRUE(WaitOnline(ids)) << "workers did not say hello in time";
    return ids;
  }

  void RestartWorker(size_t index) {
    workers_[index]->Start();
    proxy_->Track(workers_[index]->pid());
  }

  json MlpSpec(const std::vector<int64_t>& worker_ids, int rounds, int min_workers, double timeout_s,
               int fault_tolerance) const {
    json spec = TabularJobSpec("e2e-faults", dataset_id_, model_id_, worker_ids, rounds, 3);
    json& distributed = spec["distributed"];
    distributed["min_workers"] = min_workers;
    distributed["aggregation_timeout"] = timeout_s;
    distributed["join_window"] = 1;
    distributed["fault_tolerance"] = fault_tolerance;
    return spec;
  }

  std::string UpdatePrefix(int64_t job_id, int round, int attempt) const {
    return "PUT /blobs/" + AttemptPrefix(job_id, round, attempt) + "/updates/";
  }

  bool WaitCommitted(int64_t job_id, int round, seconds timeout) {
    return WaitForEvent(
        *admin_, job_id,
        [&](const std::string& type, const json& d) {
          return type == "round_committed" && d.value("round", 0) == round;
        },
        timeout);
  }

  // The checks every fault test ends with: the job succeeded with every round committed once, each committed round
  // is the FedAvg of its accepted updates, no worker's update is counted twice in an attempt (events and records
  // agree), and each round_committed event counts exactly the accepted updates of its attempt.
  void ExpectCleanRounds(int64_t job_id, int num_rounds) {
    json rounds = Rounds(*admin_, job_id);
    std::map<int, int> committed;
    std::map<std::pair<int, int>, std::set<int64_t>> accepted_by_attempt;
    for (const json& r : rounds) {
      if (r["outcome"] != "committed") continue;
      committed[r["round"].get<int>()]++;
      std::vector<int64_t> accepted;
      for (const json& u : r["updates"]) {
        if (u["status"] == "accepted") accepted.push_back(u["worker_id"].get<int64_t>());
      }
      EXPECT_EQ(std::set<int64_t>(accepted.begin(), accepted.end()).size(), accepted.size()) << r.dump();
      accepted_by_attempt[{r["round"].get<int>(), r["attempt"].get<int>()}] = {accepted.begin(), accepted.end()};
    }
    for (int round = 1; round <= num_rounds; ++round) EXPECT_EQ(committed[round], 1) << "round " << round;
    std::set<std::tuple<int, int, int64_t>> seen;
    for (const auto& [type, d] : AllEvents(*admin_, job_id)) {
      if (type == "update_accepted") {
        const auto key = std::make_tuple(d.value("round", 0), d.value("attempt", 0), d.value("worker_id", int64_t{0}));
        EXPECT_TRUE(seen.insert(key).second) << "update counted twice: " << d.dump();
      }
      if (type == "round_committed") {
        const auto it = accepted_by_attempt.find({d.value("round", 0), d.value("attempt", 0)});
        ASSERT_NE(it, accepted_by_attempt.end()) << d.dump();
        EXPECT_EQ(d.value("num_updates", -1), static_cast<int>(it->second.size())) << d.dump();
      }
    }
    for (const auto& [round_attempt, workers] : accepted_by_attempt) {
      for (int64_t w : workers) {
        EXPECT_TRUE(seen.count({round_attempt.first, round_attempt.second, w}))
            << "round " << round_attempt.first << " counts worker " << w << " without its update_accepted event";
      }
    }
    EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), num_rounds);
  }

  std::unique_ptr<TcpProxy> proxy_;
};

// Five workers, min_workers 2: two on healthy links, one whose link drops mid-upload, one throttled, one cut for
// good. Round 1 commits with the two healthy ones at its timeout; the dropped and the throttled worker take part in a
// later round once their links are back.
TEST_F(NetworkFaultsTest, DroppedThrottledAndCutLinksLeaveTheRoundToTheOthers) {
  // 50,000 hidden units: an update of about 1 MB, so a link of 32 KB/s takes half a minute to upload it.
  ASSERT_NO_FATAL_FAILURE(StartServer("50000", tmp_.path() / "server"));
  std::vector<int64_t> ids = StartLinkedWorkers(5);
  const pid_t dropped = workers_[2]->pid(), throttled = workers_[3]->pid(), cut = workers_[4]->pid();
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, 3, 2, 12, 2));
  ASSERT_GT(job_id, 0);
  // Dropped mid-upload for 8 s: long past the heartbeat timeout (3 s), so the coordinator gives up on it first, and
  // short of the round's 12 s timeout.
  proxy_->PauseMidRequest(dropped, UpdatePrefix(job_id, 1, 1), 128 * 1024, seconds(8));
  proxy_->Throttle(throttled, 32 * 1024);
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        return type == "task_assigned" && d.value("worker_id", int64_t{0}) == ids[4] && d.value("round", 0) == 1;
      },
      seconds(60)));
  proxy_->Cut(cut);
  ASSERT_TRUE(proxy_->WaitTriggered(dropped, seconds(60))) << "the dropped worker's upload never started";

  ASSERT_TRUE(WaitCommitted(job_id, 1, seconds(90)));
  // Still throttled: the round is over for it, so it must give up its upload (not finish it) and take a new task.
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        return type == "task_assigned" && d.value("worker_id", int64_t{0}) == ids[3] && d.value("round", 0) >= 2;
      },
      seconds(90)));
  proxy_->Resume(throttled);
  EXPECT_FALSE(
      fs::exists(BlobPath(AttemptPrefix(job_id, 1, 1) + "/updates/w" + std::to_string(ids[3]) + ".safetensors")))
      << "the throttled worker's upload to a round that was over went on to the end";
  json job = WaitForJobEnd(*admin_, job_id, seconds(180));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  json rounds = Rounds(*admin_, job_id);
  std::set<int64_t> later;  // workers accepted after round 1
  for (const json& r : rounds) {
    if (r["outcome"] != "committed") continue;
    if (r["round"] == 1) {
      EXPECT_EQ(Accepted(r), (std::set<int64_t>{ids[0], ids[1]})) << r.dump();
      // The faulty three were given tasks and left with no update recorded: nothing partial is counted.
      for (int64_t w : {ids[2], ids[3], ids[4]}) {
        EXPECT_NE(std::find(r["participants"].begin(), r["participants"].end(), json(w)), r["participants"].end())
            << "worker " << w << " was not a participant: " << r.dump();
        for (const json& u : r["updates"]) EXPECT_NE(u["worker_id"], w) << r.dump();
      }
    } else {
      for (int64_t w : Accepted(r)) later.insert(w);
    }
  }
  EXPECT_TRUE(later.count(ids[2])) << "the worker whose link dropped did not rejoin: " << rounds.dump(2);
  EXPECT_TRUE(later.count(ids[3])) << "the throttled worker did not rejoin: " << rounds.dump(2);
  EXPECT_FALSE(later.count(ids[4])) << rounds.dump(2);

  std::map<int64_t, std::string> dropped_causes;  // round 1
  for (const auto& [type, d] : AllEvents(*admin_, job_id)) {
    if (type == "worker_dropped" && d.value("round", 0) == 1) {
      dropped_causes[d.value("worker_id", int64_t{0})] = d.value("cause", "");
    }
  }
  EXPECT_EQ(dropped_causes[ids[3]], "straggler") << "the throttled worker is cut at the round's timeout";
  EXPECT_EQ(dropped_causes[ids[2]], "disconnected");
  EXPECT_EQ(dropped_causes[ids[4]], "disconnected");
  ExpectCleanRounds(job_id, 3);
}

// The coordinator is SIGKILLed while a worker's update is half uploaded, and another worker is SIGKILLed after its
// upload, before its result: neither update is counted, the killed attempt is retried, and the job completes.
TEST_F(NetworkFaultsTest, RestartMidUploadAndWorkerKilledBeforeItsResultCountNothingTwice) {
  ASSERT_NO_FATAL_FAILURE(StartServer("16000", tmp_.path() / "server"));
  std::vector<int64_t> ids = StartLinkedWorkers(3);
  const pid_t uploader = workers_[1]->pid(), reporter = workers_[2]->pid();
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, 3, 1, 30, 3));
  ASSERT_GT(job_id, 0);
  // Round 1: the third worker's result is held on its link (its update is stored by then); it dies there.
  proxy_->PauseMidRequest(reporter, "POST /api/v1/worker/result", 0, std::chrono::hours(1));
  // Round 2: the second worker's upload stops half way, and the coordinator dies meanwhile.
  proxy_->PauseMidRequest(uploader, UpdatePrefix(job_id, 2, 1), 64 * 1024, std::chrono::hours(1));

  ASSERT_TRUE(proxy_->WaitTriggered(reporter, seconds(60))) << "the third worker never reported";
  const fs::path stored_update =
      BlobPath(AttemptPrefix(job_id, 1, 1) + "/updates/w" + std::to_string(ids[2]) + ".safetensors");
  EXPECT_TRUE(fs::exists(stored_update)) << "its update should be stored before its result is sent";
  workers_[2]->Kill();
  proxy_->Cut(reporter);  // what the dead worker had sent is lost with it
  ASSERT_TRUE(WaitCommitted(job_id, 1, seconds(60)));

  ASSERT_TRUE(proxy_->WaitTriggered(uploader, seconds(60))) << "the round 2 upload never started";
  server_->Kill();
  server_->Start();
  admin_ = server_->Admin();
  proxy_->Resume(uploader);  // its connection to the dead coordinator is gone; it goes on with the new one
  proxy_->Resume(reporter);
  RestartWorker(2);
  json job = WaitForJobEnd(*admin_, job_id, seconds(180));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  bool resumed = false, rejoined = false;
  for (const auto& [type, d] : AllEvents(*admin_, job_id)) {
    if (type == "job_resumed" && d.value("committed_round", -1) == 1) resumed = true;
  }
  EXPECT_TRUE(resumed) << "the restarted coordinator should resume after round 1";
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["round"] == 1 && r["outcome"] == "committed") {
      EXPECT_EQ(Accepted(r), (std::set<int64_t>{ids[0], ids[1]})) << r.dump();
      for (const json& u : r["updates"])
        EXPECT_NE(u["worker_id"], ids[2]) << "an update without its result" << r.dump();
    }
    if (r["round"] == 2 && r["attempt"] == 1) {
      EXPECT_EQ(r["outcome"], "failed") << "the attempt the restart killed: " << r.dump();
      for (const json& u : r["updates"]) EXPECT_NE(u["worker_id"], ids[1]) << "a half upload was recorded" << r.dump();
    }
    if (r["round"] == 2 && r["outcome"] == "committed") {
      EXPECT_GE(r["attempt"].get<int>(), 2) << r.dump();
    }
    if (r["round"].get<int>() >= 2 && r["outcome"] == "committed" && Accepted(r).count(ids[2])) rejoined = true;
  }
  EXPECT_TRUE(rejoined) << "the killed worker, restarted, should take part again";
  ExpectCleanRounds(job_id, 3);
}

// Unmounts (lazily: a process may still hold a file there) when it goes out of scope.
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    const std::string options = "size=" + size;
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// Fills the file system of `dir` with one file until a write fails; returns the bytes written.
uint64_t FillUp(const fs::path& file) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) return 0;
  std::vector<char> chunk(64 * 1024, 'x');
  uint64_t written = 0;
  while (true) {
    const size_t n = std::fwrite(chunk.data(), 1, chunk.size(), f);
    written += n;
    if (n < chunk.size() || std::fflush(f) != 0) break;
  }
  std::fclose(f);
  return written;
}

// The data directory on a 16 MB tmpfs, filled up while round 2's updates are on their way.
TEST_F(NetworkFaultsTest, DiskFullFailsTheRoundSayingSoAndTheJobResumesOnceSpaceIsBack) {
  const fs::path data_dir = tmp_.path() / "server";
  TmpfsMount mount(data_dir, "16m");
  if (!mount.mounted()) GTEST_SKIP() << "this machine does not allow mounting a tmpfs: " << mount.error();
  ASSERT_NO_FATAL_FAILURE(StartServer("32", data_dir));
  std::vector<int64_t> ids = StartLinkedWorkers(2);
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, 3, 1, 30, 20));
  ASSERT_GT(job_id, 0);
  // Round 2's uploads wait on their links until the disk is full.
  for (size_t i = 0; i < 2; ++i)
    proxy_->PauseMidRequest(workers_[i]->pid(), UpdatePrefix(job_id, 2, 1), 0, std::chrono::hours(1));
  ASSERT_TRUE(WaitCommitted(job_id, 1, seconds(60)));
  std::string round1_sha;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["round"] == 1 && r["outcome"] == "committed") round1_sha = r.value("global_sha256", "");
  }
  ASSERT_FALSE(round1_sha.empty());
  ASSERT_TRUE(proxy_->WaitTriggered(workers_[0]->pid(), seconds(60)));
  const fs::path filler = data_dir / "filler";
  EXPECT_GT(FillUp(filler), 0u);
  for (size_t i = 0; i < 2; ++i) proxy_->Resume(workers_[i]->pid());

  // While the disk is full nothing can be recorded (the metadata store is on it too): the job's live view says why
  // it waits, or, if the store took the round's failure, the failed round does.
  std::string said;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (said.empty() && std::chrono::steady_clock::now() < deadline) {
    StatusOr<http::ClientResponse> view = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
    if (view.ok() && view->Json().ok()) {
      const json live = (*view->Json()).value("live", json::object());
      if (live.value("store_error", "").find("disk full") != std::string::npos) said = live["store_error"];
    }
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r.value("failure_reason", "").find("disk full") != std::string::npos) said = r["failure_reason"];
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
  fs::remove(filler);
  EXPECT_NE(said.find("disk full"), std::string::npos) << "nothing said \"disk full\" while the disk was full";
  EXPECT_NE(said.find("free space and the job resumes"), std::string::npos) << said;

  json job = WaitForJobEnd(*admin_, job_id, seconds(180));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  // The record, once space is back: round 2's first attempt failed for the full disk; round 1 is kept as it was.
  std::string round2_failure;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["round"] == 1 && r["outcome"] == "committed") {
      EXPECT_EQ(r.value("global_sha256", ""), round1_sha);
    }
    if (r["round"] == 2 && r["attempt"] == 1) round2_failure = r.value("failure_reason", "");
  }
  EXPECT_NE(round2_failure.find("disk full"), std::string::npos) << round2_failure;
  std::printf("[figures] disk full: while full: %s; round 2 attempt 1: %s\n", said.c_str(), round2_failure.c_str());
  ExpectCleanRounds(job_id, 3);
  for (auto& w : workers_) w->Terminate();
  server_->Terminate();
  // The uploads the full disk refused were answered "disk full", without the server's paths (its log keeps them).
  bool told = false;
  for (auto& w : workers_) {
    const std::string log = w->log();
    told = told || log.find("disk full") != std::string::npos;
    EXPECT_EQ(log.find(data_dir.string()), std::string::npos) << w->name() << " was told a server path:\n" << log;
  }
  EXPECT_TRUE(told) << "no worker was told its upload met a full disk";
}

}  // namespace
}  // namespace parsyn::e2e
