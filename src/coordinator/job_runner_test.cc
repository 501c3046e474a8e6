// In-process tests of JobRunner on a fake JobHost: an in-memory SQLite store behind FaultyMetadataStore, a
// MemoryBlobStore, FakeClock and a real io_context run by the test. Scripted workers train "updates" without torch:
// each is the task's global plus a constant that depends on the round and the worker's shard only, so every run of
// a job, interrupted or not, commits the same globals.
//
// Covered: normal rounds (FedAvg of the updates), a store error at each durable write of a job (the runner neither
// runs ahead of the store nor wedges: it retries the round once the store answers), and a restart from each
// checkpoint (a new runner on the same stores finishes with the same final global).
#include "coordinator/job_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/testing/temp_dir.h"
#include "coordinator/job_runner_internal.h"
#include "loop/loop_tools.h"
#include "storage/byte_source.h"
#include "storage/directory_blob_store.h"
#include "storage/disk_full.h"
#include "storage/faulty_metadata_store.h"
#include "storage/memory_blob_store.h"
#include "storage/sqlite_store.h"
#include "strategy/rdp_accountant.h"
#include "weights/safetensors.h"
#include "weights/update_codec.h"
#include "weights/zstd_stream.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;

constexpr int kRounds = 3;
constexpr int kRows = 40;
constexpr std::string_view kUrlScheme = "mem:";

// Workers get "mem:<key>" URLs and write their updates straight into the memory store.
class MemoryBlobUrls final : public storage::BlobUrlIssuer {
 public:
  StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds) const override {
    return std::string(kUrlScheme) + std::string(key);
  }
  StatusOr<storage::UrlGrant> PutGrant(std::string_view key, std::chrono::seconds) const override {
    return storage::UrlGrant{.url = std::string(kUrlScheme) + std::string(key), .headers = {}};
  }
  std::chrono::seconds max_ttl() const override { return std::chrono::hours(24); }
  bool transfers_bypass_coordinator() const override { return true; }
};

// The service's part for one job: stores, pool, clock, and worker sessions reduced to a task queue per worker.
class FakeHost final : public JobHost {
 public:
  struct Session {
    bool online = true;
    std::deque<json> queued;      // delivered by the runner, not yet picked up
    std::optional<json> current;  // being worked on
  };

  FakeHost(boost::asio::io_context& io, storage::MetadataStore& store, storage::BlobStore& blobs, const Clock& clock,
           std::filesystem::path dir)
      : io_(io),
        store_(store),
        blobs_(blobs),
        clock_(clock),
        dir_(std::move(dir)),
        pool_(2),
        writes_(io.get_executor(), pool_, store) {}
  ~FakeHost() override { pool_.join(); }

  storage::MetadataStore& store() override { return store_; }
  storage::BlobStore& blobs() override { return blobs_; }
  storage::BlobUrlIssuer& blob_urls() override { return urls_; }
  std::string BlobGetUrl(std::string_view key, std::chrono::seconds ttl, int64_t) const override {
    get_urls_issued_++;
    return *urls_.GetUrl(key, ttl);
  }
  StatusOr<storage::UrlGrant> BlobPutGrant(std::string_view key, std::chrono::seconds ttl, int64_t) const override {
    return urls_.PutGrant(key, ttl);
  }
  std::chrono::seconds TaskUrlTtl(std::chrono::milliseconds) const override { return std::chrono::hours(1); }
  boost::asio::thread_pool& pool() override { return pool_; }
  boost::asio::any_io_executor executor() override { return io_.get_executor(); }
  const Clock& clock() const override { return clock_; }
  std::filesystem::path spool_dir() const override { return dir_ / "spool"; }
  bool keep_updates() const override { return false; }

  http::Awaitable<void> AppendEvent(int64_t job_id, std::string type, json payload) override {
    std::vector<QueuedEvent> events;
    events.push_back({type, std::move(payload)});
    auto applied = WriteQueue::Wait(QueueJobWrites(job_id, {}, std::move(events)));  // kCoAwaitTemporaries
    Status s = co_await std::move(applied);
    if (!s.ok()) PARSYN_LOG_WARN("event {} not stored: {}", type, s.ToString());
  }
  WriteQueue::TicketPtr QueueJobWrites(int64_t job_id, std::vector<storage::BatchWrite> records,
                                       std::vector<QueuedEvent> events) override {
    for (QueuedEvent& e : events) {
      records.push_back(storage::JobEvent{
          .job_id = job_id, .type = e.type, .payload_json = e.payload.dump(), .time_ms = clock_.UnixMillis()});
    }
    return writes_.Queue(std::move(records));
  }
  bool DeliverTask(int64_t worker_id, int64_t, TaskMessage task) override {
    Session& s = sessions_[worker_id];
    if (!s.online) return false;
    get_urls_at_delivery_.push_back(get_urls_issued_);
    json parsed = json::parse(task.json);  // what the worker's poll is answered with
    EXPECT_EQ(parsed["round"], task.round);
    EXPECT_EQ(parsed["attempt"], task.attempt);
    s.queued.push_back(std::move(parsed));
    return true;
  }
  void AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt) override {
    Session& s = sessions_[worker_id];
    auto same = [&](const json& t) { return t["job_id"] == job_id && t["round"] == round && t["attempt"] == attempt; };
    std::erase_if(s.queued, same);
    if (s.current && same(*s.current)) s.current.reset();
  }
  void TaskFinished(int64_t worker_id, int64_t job_id) override {
    Session& s = sessions_[worker_id];
    if (s.current && (*s.current)["job_id"] == job_id) s.current.reset();
  }
  std::vector<int64_t> IdleWorkers() const override {
    std::vector<int64_t> idle;
    for (const auto& [id, s] : sessions_) {
      if (s.online && s.queued.empty() && !s.current) idle.push_back(id);
    }
    return idle;
  }
  bool WorkerHasLocalData(int64_t worker_id) const override { return local_rows_.count(worker_id) > 0; }
  bool WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view) const override {
    return name == protocol::kBuiltinTrainer || trainers_.count({worker_id, std::string(name)}) > 0;
  }
  bool WorkerServesProject(int64_t worker_id, int64_t project_id) const override {
    auto it = worker_projects_.find(worker_id);
    return it == worker_projects_.end() || it->second == project_id;
  }
  std::map<int64_t, int64_t> worker_projects_;  // own workers of a project; the others serve every project
  // The worker offers a trainer of another name besides the built-in one.
  void OfferTrainer(int64_t worker_id, std::string name) { trainers_.insert({worker_id, std::move(name)}); }
  WorkerCapacity AnnouncedCapacity(int64_t) const override { return {}; }  // mixed LoRA ranks: the e2e tests

  std::map<int64_t, Session> sessions_;
  std::map<int64_t, int64_t> local_rows_;
  std::set<std::pair<int64_t, std::string>> trainers_;  // (worker, trainer) offered besides "builtin"
  // GET URLs issued so far (each task being built asks for several), and that count at each task delivered.
  mutable int64_t get_urls_issued_ = 0;
  std::vector<int64_t> get_urls_at_delivery_;  // workers whose hello announced data of their own: its training rows

 private:
  boost::asio::io_context& io_;
  storage::MetadataStore& store_;
  storage::BlobStore& blobs_;
  const Clock& clock_;
  std::filesystem::path dir_;
  boost::asio::thread_pool pool_;
  MemoryBlobUrls urls_;
  WriteQueue writes_;
};

std::vector<std::byte> WeightsBytes(const std::vector<float>& values) {
  weights::WeightSet set;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(float));
  EXPECT_TRUE(set.Add("w", weights::DType::kF32, {static_cast<int64_t>(values.size())}, bytes).ok());
  return weights::SerializeSafetensors(set);
}

std::vector<float> WeightsValues(std::span<const std::byte> bytes) {
  StatusOr<weights::WeightSet> set = weights::ParseSafetensors(bytes);
  EXPECT_TRUE(set.ok()) << set.status().ToString();
  if (!set.ok() || set->Find("w") == nullptr) return {};
  std::span<float> values = set->Find("w")->as<float>();
  return {values.begin(), values.end()};
}

// What a worker adds to the global in `round` on `shard`.
float Delta(int round, int shard) { return 0.25f * static_cast<float>(round) + 1.0f + static_cast<float>(shard); }

// One job on fresh stores, and the scripted workers that run its tasks.
class JobFixture {
 public:
  // `distributed` entries override the job's (e.g. num_rounds, early_stopping); own_data: a job whose data.source is
  // "workers" (no dataset; the workers report their own sample counts).
  // directory_blobs: the blobs live in a DirectoryBlobStore (files a test can change on disk) instead of memory.
  // workers: how many workers the job lists (its min_workers and max_workers stay 2 unless `distributed` says).
  explicit JobFixture(json distributed = json::object(), bool own_data = false, bool directory_blobs = false,
                      int workers = 2)
      : distributed_(std::move(distributed)), own_data_(own_data), num_workers_(workers) {
    if (directory_blobs) {
      auto store = storage::DirectoryBlobStore::Open(dir_.path() / "blobs");
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      if (store.ok()) blob_store_ = std::move(*store);
      memory_blobs_ = nullptr;
    }
    Init();
  }
  ~JobFixture() {
    runner_.reset();
    Settle();
  }

  void Init() {
    auto sqlite = storage::SqliteMetadataStore::Open(":memory:");
    ASSERT_TRUE(sqlite.ok()) << sqlite.status().ToString();
    store_ = std::make_unique<storage::FaultyMetadataStore>(std::move(*sqlite));
    host_ = std::make_unique<FakeHost>(io_, *store_, *blob_store_, clock_, dir_.path());

    std::string csv = "x,label\n";
    for (int i = 0; i < rows(); ++i) csv += std::to_string(i) + "," + std::to_string(i % 2) + "\n";
    storage::BlobInfo data = Put("datasets/1/data.csv", csv);
    auto dataset = store_->CreateDataset({.name = "rows.csv",
                                          .format = storage::DatasetFormat::kCsv,
                                          .kind = storage::DatasetKind::kTabular,
                                          .row_count = rows(),
                                          .size_bytes = static_cast<int64_t>(data.size_bytes),
                                          .sha256 = data.sha256,
                                          .blob_key = data.key});
    ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
    const std::vector<std::byte> initial = WeightsBytes({0, 0, 0, 0});
    storage::BlobInfo global =
        Put("models/1/model.safetensors", std::string(reinterpret_cast<const char*>(initial.data()), initial.size()));
    auto model = store_->CreateModel({.name = "tabular",
                                      .model_type = "tabular",
                                      .config_json = "{}",
                                      .files = {{.path = "model.safetensors",
                                                 .blob_key = global.key,
                                                 .size_bytes = static_cast<int64_t>(global.size_bytes),
                                                 .sha256 = global.sha256}},
                                      .size_bytes = static_cast<int64_t>(global.size_bytes)});
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    std::vector<int64_t> workers;
    for (int i = 0; i < num_workers_; ++i) {
      auto w = store_->CreateWorker({.name = "w" + std::to_string(i), .token_sha256 = "token" + std::to_string(i)});
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      workers.push_back(w->id);
      host_->sessions_[w->id];
    }
    if (own_data_) {
      // Train splits 100 and 500 rows: more than 4x apart.
      host_->local_rows_ = {{workers[0], 100}, {workers[1], 500}};
    }
    json spec_json = {{"name", "in-process"},
                      {"dataset_id", dataset->id},
                      {"model_id", model->id},
                      {"config", {{"use_peft", false}, {"label_column", "label"}, {"seed", 7}}},
                      {"distributed",
                       {{"enabled", true},
                        {"num_rounds", kRounds},
                        {"steps_per_round", 5},
                        {"min_workers", 2},
                        {"max_workers", 2},
                        {"aggregation_timeout", 60},
                        {"fault_tolerance", 1}}},
                      {"worker_selection", {{"mode", "own"}, {"worker_ids", workers}}}};
    spec_json["distributed"].update(distributed_);
    if (own_data_) {
      spec_json.erase("dataset_id");
      spec_json["data"] = {{"source", "workers"}, {"max_samples_per_worker", 500}};
    }
    StatusOr<JobSpec> spec = ParseJobSpecJson(spec_json);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto job = store_->CreateJob({.name = "in-process",
                                  .dataset_id = own_data_ ? 0 : dataset->id,
                                  .model_id = model->id,
                                  .spec_json = JobSpecToJsonString(*spec),
                                  .private_seed = std::string(64, 'c')});
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    job_id_ = job->id;
  }

  // The dataset's rows: kRows, or two per worker for jobs over more than kRows / 2 workers.
  int rows() const { return std::max(kRows, 2 * num_workers_); }

  storage::BlobInfo Put(const std::string& key, std::string bytes) {
    storage::StringByteSource source(std::move(bytes));
    StatusOr<storage::BlobInfo> info = blob_store_->Put(key, source);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? *info : storage::BlobInfo{};
  }

  // Runs `op` on the loop until it completes (the pool's work included), then whatever it left to run.
  template <typename T>
  T Run(http::Awaitable<T> op) {
    std::optional<T> result;
    auto store_result = [&result, op = std::move(op)]() mutable -> http::Awaitable<void> {
      result.emplace(co_await std::move(op));
    };
    Run(store_result());
    return std::move(*result);
  }
  void Run(http::Awaitable<void> op) {
    bool done = false;
    boost::asio::co_spawn(io_, std::move(op), [&](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
      done = true;
    });
    while (!done) io_.run_one_for(std::chrono::milliseconds(10));
    Settle();
  }
  // Handlers still due (detached follow-ups, their offloads) run until the loop has been idle for `polls` polls of
  // `poll` each. Short by default: it follows every step, and a follow-up it misses runs in the next one.
  void Settle(int polls = 2, std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    for (int idle = 0; idle < polls;) idle = io_.run_one_for(poll) == 0 ? idle + 1 : 0;
  }
  // Runs the loop until `done` (true) or 30 s have passed (false).
  bool RunUntil(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io_.run_one_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // A runner for the job as the store has it now (queued: set up; running: resumed), launched.
  Status StartRunner() {
    runner_.reset();
    for (auto& [id, s] : host_->sessions_) s = FakeHost::Session{};  // a restart ends every session
    StatusOr<storage::TrainingJob> job = store_->GetJob(job_id_);
    if (!job.ok()) return job.status();
    StatusOr<JobSpec> spec = ParseJobSpec(job->spec_json);
    if (!spec.ok()) return spec.status();
    runner_ = std::make_unique<JobRunner>(*host_, *job, *spec);
    return Run(runner_->Launch());
  }

  // One step of every worker: pick up a queued task, or run the current one and report, or offer itself.
  void Step() {
    for (auto& [worker, session] : host_->sessions_) {
      if (!session.current && !session.queued.empty()) {
        session.current = std::move(session.queued.front());
        session.queued.pop_front();
        continue;
      }
      if (session.current) {
        const json task = *session.current;
        ResultReport report = Work(task);
        StatusOr<json> answer = Run(runner_->Result(worker, report));
        if (!answer.ok()) session.current.reset();  // refused (e.g. a late result): the worker moves on
        continue;
      }
      if (runner_->IsEligible(worker)) Run(runner_->WorkerAvailable(worker));
    }
    clock_.Advance(std::chrono::milliseconds(500));
    if (runner_->TickDue()) Run(runner_->Tick());
  }

  // The worker's part of a task: an update (train) or only the evaluation of the global.
  ResultReport Work(const json& task) {
    ResultReport report{.round = task["round"], .attempt = task["attempt"]};
    const bool own_data = task.value("data_source", "") == "workers";
    const int64_t own_rows = own_data ? host_->local_rows_.at(WorkerOf(task)) : 0;
    report.validation_samples = own_data ? own_rows / 9 : task["data"]["validation_rows"].get<int64_t>();
    // A train task of round r evaluates global r-1; the final evaluation the last committed global.
    report.validation_loss =
        validation_loss_(task["kind"] == "train" ? task["round"].get<int>() - 1 : StoredJob().committed_round);
    if (task["kind"] != "train") return report;
    const std::string global_key = task["global_weights"]["url"].get<std::string>().substr(kUrlScheme.size());
    const std::vector<float> global = WeightsValues(ReadBlob(global_key));
    std::vector<float> values = global;
    for (float& v : values) v += Delta(task["round"], task["shard"]);
    const std::vector<std::byte> update = encode_update_ ? encode_update_(task, global, values) : WeightsBytes(values);
    report.blob_key = task["update_upload"]["blob_key"];
    storage::BlobInfo info =
        Put(report.blob_key, std::string(reinterpret_cast<const char*>(update.data()), update.size()));
    report.sha256 = info.sha256;
    report.sample_count = own_data ? own_rows : task["data"]["train_rows"].get<int64_t>();
    report.train_loss = 1.0;
    return report;
  }

  // The worker a task was built for ("<job>-<round>-<attempt>-w<worker>").
  static int64_t WorkerOf(const json& task) {
    const std::string id = task["task_id"];
    return std::stoll(id.substr(id.rfind('w') + 1));
  }

  std::vector<std::byte> ReadBlob(const std::string& key) {
    StatusOr<std::unique_ptr<storage::ByteSource>> source = blob_store_->Get(key);
    EXPECT_TRUE(source.ok()) << key << ": " << source.status().ToString();
    std::vector<std::byte> out;
    if (!source.ok()) return out;
    std::byte buffer[4096];
    while (true) {
      StatusOr<size_t> n = (*source)->Read(buffer);
      if (!n.ok() || *n == 0) break;
      out.insert(out.end(), buffer, buffer + *n);
    }
    return out;
  }

  storage::TrainingJob StoredJob() {
    StatusOr<storage::TrainingJob> job = store_->GetJob(job_id_);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? *job : storage::TrainingJob{};
  }

  // Steps until the runner has ended or `until` holds, checking after each step that the runner's committed round
  // is the store's (it never runs ahead of it). False when the step budget ran out (the job is wedged).
  bool Drive(const std::function<bool()>& until = {}, int max_steps = 400) {
    for (int i = 0; i < max_steps; ++i) {
      if (runner_->finished() || (until && until())) return true;
      Step();
      const int in_memory = runner_->LiveView().value("committed_round", 0);
      EXPECT_LE(in_memory, StoredJob().committed_round) << "the runner is ahead of the store";
      if (in_memory > StoredJob().committed_round) return false;
    }
    return runner_->finished() || (until && until());
  }

  // The bytes of the global the store holds as the job's last committed one.
  std::vector<std::byte> CommittedGlobal() {
    const storage::TrainingJob job = StoredJob();
    StatusOr<std::vector<storage::Round>> rounds = store_->ListRounds(job_id_);
    EXPECT_TRUE(rounds.ok());
    for (const storage::Round& r : *rounds) {
      if (r.round == job.committed_round && r.status == storage::RoundStatus::kCommitted) {
        return ReadBlob(r.global_blob_key);
      }
    }
    ADD_FAILURE() << "no committed global for round " << job.committed_round;
    return {};
  }

  json distributed_;
  // When set: the bytes a worker uploads for the task, given the global and its plain update (a compressed update).
  std::function<std::vector<std::byte>(const json& task, const std::vector<float>& global,
                                       const std::vector<float>& update)>
      encode_update_;
  // The validation loss the workers measure for the global of a round (0: the starting weights).
  std::function<double(int global_round)> validation_loss_ = [](int) { return 0.5; };
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_ = boost::asio::make_work_guard(io_);
  test_support::TempDir dir_{"parsyn-job-runner"};
  FakeClock clock_;
  std::unique_ptr<storage::BlobStore> blob_store_ = std::make_unique<storage::MemoryBlobStore>();
  storage::MemoryBlobStore* memory_blobs_ = static_cast<storage::MemoryBlobStore*>(blob_store_.get());  // or null
  std::unique_ptr<storage::FaultyMetadataStore> store_;
  std::unique_ptr<FakeHost> host_;
  std::unique_ptr<JobRunner> runner_;
  int64_t job_id_ = 0;
  bool own_data_ = false;
  int num_workers_ = 2;
};

// The final global of an uninterrupted run of the job, and how many store writes it made after its start.
struct Reference {
  std::vector<std::byte> global;
  int writes = 0;
};
const Reference& UninterruptedRun() {
  static const Reference reference = [] {
    Reference r;
    JobFixture f;
    const int before = f.store_->writes_passed();
    EXPECT_TRUE(f.StartRunner().ok());
    EXPECT_TRUE(f.Drive());
    r.writes = f.store_->writes_passed() - before;
    r.global = f.CommittedGlobal();
    return r;
  }();
  return reference;
}

// Where the coordinator asks the workers of one round's attempt to upload their updates.
std::string UpdatesPrefix(const JobFixture& f, int round, int attempt) {
  return "jobs/" + std::to_string(f.job_id_) + "/rounds/" + std::string(6 - std::to_string(round).size(), '0') +
         std::to_string(round) + "-a" + std::to_string(attempt) + "/updates/";
}

// Waits (up to 10 s: deletes run off the loop) until no blob is left under prefix.
bool BlobsGoneUnder(JobFixture& f, const std::string& prefix) {
  for (int i = 0; i < 1000; ++i) {
    StatusOr<std::vector<std::string>> left = f.blob_store_->List(prefix);
    if (left.ok() && left->empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// True once no update of the attempt is left in the blob store: the runner deletes them on its pool, in the
// background, when the attempt ends (committed or failed). Fails if the attempt recorded no update, or one under
// another prefix (then an empty prefix would prove nothing).
bool UpdatesDeleted(JobFixture& f, int round, int attempt) {
  const std::string prefix = UpdatesPrefix(f, round, attempt);
  StatusOr<std::vector<storage::RoundUpdate>> recorded = f.store_->ListUpdates(f.job_id_, round, attempt);
  if (!recorded.ok() || recorded->empty()) return false;
  for (const storage::RoundUpdate& u : *recorded) {
    if (!u.blob_key.starts_with(prefix)) return false;
  }
  return BlobsGoneUnder(f, prefix);
}

TEST(JobRunnerTest, RoundsCommitTheFedAvgOfTheUpdates) {
  JobFixture f;
  ASSERT_TRUE(f.StartRunner().ok());
  std::vector<int64_t> train_rows;
  StatusOr<std::vector<storage::Shard>> shards = f.store_->ListShards(f.job_id_);
  ASSERT_TRUE(shards.ok());
  ASSERT_EQ(shards->size(), 2u);
  int64_t labelled = 0;
  for (const storage::Shard& s : *shards) {
    train_rows.push_back(s.train_rows);
    // An iid CSV job's shards carry their label histograms too: every training row counted once, labels 0 and 1.
    const json histogram = json::parse(s.label_histogram_json);
    int64_t counted = 0;
    for (const auto& [label, count] : histogram.items()) {
      EXPECT_TRUE(label == "0" || label == "1") << label;
      counted += count.get<int64_t>();
    }
    EXPECT_EQ(counted, s.train_rows) << s.label_histogram_json;
    labelled += counted;
  }
  EXPECT_GT(labelled, 0);

  // Every live view on the way shows at most round kRounds; the final evaluation is named, without a round number.
  bool saw_final_evaluation = false;
  ASSERT_TRUE(f.Drive([&] {
    const json live = f.runner_->LiveView();
    if (live.contains("round")) {
      EXPECT_LE(live["round"].get<int>(), kRounds) << live.dump();
    }
    if (live.value("phase", "") == "final_evaluation") {
      saw_final_evaluation = true;
      EXPECT_FALSE(live.contains("round")) << live.dump();
      EXPECT_FALSE(live.contains("attempt")) << live.dump();
      EXPECT_EQ(live["committed_round"], kRounds);
    }
    return false;
  }));
  EXPECT_TRUE(saw_final_evaluation);
  const storage::TrainingJob job = f.StoredJob();
  EXPECT_EQ(job.status, storage::JobStatus::kSucceeded);
  EXPECT_EQ(job.committed_round, kRounds);

  // global_r = global_{r-1} + sum(n_i * delta(r, i)) / sum(n_i), starting from zeros.
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  float expected = 0;
  int committed = 0;
  for (const storage::Round& r : *rounds) {
    if (r.status != storage::RoundStatus::kCommitted) continue;
    ++committed;
    const double n0 = static_cast<double>(train_rows[0]), n1 = static_cast<double>(train_rows[1]);
    expected += static_cast<float>((n0 * Delta(r.round, 0) + n1 * Delta(r.round, 1)) / (n0 + n1));
    for (float v : WeightsValues(f.ReadBlob(r.global_blob_key))) EXPECT_NEAR(v, expected, 1e-5) << "round " << r.round;
    StatusOr<std::vector<storage::RoundUpdate>> updates = f.store_->ListUpdates(f.job_id_, r.round, r.attempt);
    ASSERT_TRUE(updates.ok());
    EXPECT_EQ(updates->size(), 2u);
    // Their records stay; their bytes go once the round is committed.
    EXPECT_TRUE(UpdatesDeleted(f, r.round, r.attempt)) << "round " << r.round;
  }
  EXPECT_EQ(committed, kRounds);
  EXPECT_EQ(f.CommittedGlobal(), UninterruptedRun().global);
}

// The engine is asked before an update is read: a repeated result, or one for a round the job is not at, is answered
// without a read of its update (a few workers repeating results must not hold the pool with downloads and checks).
TEST(JobRunnerTest, RepeatedAndLateResultsReadNoUpdate) {
  JobFixture f;
  ASSERT_TRUE(f.StartRunner().ok());
  auto both_working = [&] {
    return std::all_of(f.host_->sessions_.begin(), f.host_->sessions_.end(),
                       [](const auto& s) { return s.second.current.has_value(); });
  };
  ASSERT_TRUE(f.Drive(both_working));
  ASSERT_NE(f.memory_blobs_, nullptr);
  auto first = f.host_->sessions_.begin();
  const int64_t worker = first->first;
  ASSERT_EQ((*first->second.current)["round"], 1);
  const ResultReport report = f.Work(*first->second.current);
  StatusOr<json> answer = f.Run(f.runner_->Result(worker, report));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  const int64_t reads = f.memory_blobs_->gets(report.blob_key);
  EXPECT_GE(reads, 1);  // the update was checked
  StatusOr<json> repeated = f.Run(f.runner_->Result(worker, report));
  ASSERT_TRUE(repeated.ok()) << repeated.status().ToString();
  EXPECT_EQ((*repeated)["status"], "duplicate") << repeated->dump();
  EXPECT_EQ(f.memory_blobs_->gets(report.blob_key), reads) << "a repeated result read its update again";

  // The other worker reports for round 2, which has not started: refused, its (existing) upload never read.
  const int64_t other = std::next(first)->first;
  ResultReport late = f.Work(*std::next(first)->second.current);
  late.round = 2;
  late.blob_key = UpdatesPrefix(f, 2, 1) + "w" + std::to_string(other) + ".safetensors";
  late.sha256 = f.Put(late.blob_key, "not read").sha256;
  StatusOr<json> refused = f.Run(f.runner_->Result(other, late));
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status().ToString();
  EXPECT_EQ(f.memory_blobs_->gets(late.blob_key), 0) << "a result for another round read its update";
}

// distributed.compression int8 + delta + zstd: the tasks say how to encode and offer a zstd copy of the global; the
// coordinator decodes each upload (sha256 over the wire bytes) into the ordinary update before the strategy sees it.
// The worker of shard 1 sends a malformed compressed update each round (a truncated zstd frame, a decompression
// bomb, a non-finite value): each is rejected with its reason, and the job goes on with the other worker's updates.
TEST(JobRunnerTest, CompressedUpdatesAreDecodedAndMalformedOnesRejected) {
  JobFixture f({{"min_workers", 1}, {"compression", {{"update", "int8"}, {"delta", true}, {"zstd_level", 3}}}});
  auto image = [](weights::WeightSet& set) { return weights::SerializeSafetensors(set); };
  auto zstd = [](const std::vector<std::byte>& bytes) {
    StatusOr<std::vector<std::byte>> z = weights::ZstdCompress(bytes, 3);
    EXPECT_TRUE(z.ok()) << z.status().ToString();
    return z.ok() ? *z : std::vector<std::byte>{};
  };
  f.encode_update_ = [&](const json& task, const std::vector<float>& global_values, const std::vector<float>& values) {
    EXPECT_EQ(
        task["compression"],
        json({{"update", "int8"}, {"delta", true}, {"zstd_level", 3}, {"error_feedback", false}, {"global", "none"}}));
    // The zstd copy of the global decompresses to the global the task names.
    EXPECT_TRUE(task["global_weights"].contains("zstd")) << task["global_weights"].dump();
    if (task["global_weights"].contains("zstd")) {
      const std::vector<std::byte> copy =
          f.ReadBlob(task["global_weights"]["zstd"]["url"].get<std::string>().substr(kUrlScheme.size()));
      EXPECT_EQ(Sha256Hex(copy), task["global_weights"]["zstd"]["sha256"]);
      StatusOr<std::vector<std::byte>> plain = weights::ZstdDecompress(copy, task["global_weights"]["size_bytes"]);
      EXPECT_TRUE(plain.ok()) << plain.status().ToString();
      if (plain.ok()) {
        EXPECT_EQ(WeightsValues(*plain), global_values);
      }
    }
    StatusOr<weights::WeightSet> global = weights::ParseSafetensors(WeightsBytes(global_values));
    StatusOr<weights::WeightSet> update = weights::ParseSafetensors(WeightsBytes(values));
    EXPECT_TRUE(global.ok() && update.ok());
    StatusOr<weights::EncodedUpdate> encoded =
        weights::EncodeUpdate(*update, {.codec = weights::UpdateCodec::kInt8, .delta_from = &*global});
    EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
    if (task["shard"] == 0) return zstd(image(encoded->compressed));
    switch (task["round"].get<int>()) {
      case 1: {  // cut off inside the frame
        std::vector<std::byte> z = zstd(image(encoded->compressed));
        z.resize(z.size() - 6);
        return z;
      }
      case 2:  // 16 MiB of zeros: a few hundred bytes on the wire, far past what the layout allows decoded
        return zstd(std::vector<std::byte>(size_t{16} << 20));
      default: {  // a non-finite value in a tensor sent as F32
        std::span<float> w = encoded->compressed.tensors()[0].as<float>();
        w[1] = std::numeric_limits<float>::quiet_NaN();
        return zstd(image(encoded->compressed));
      }
    }
  };
  ASSERT_TRUE(f.StartRunner().ok());
  ASSERT_TRUE(f.Drive());
  const storage::TrainingJob job = f.StoredJob();
  EXPECT_EQ(job.status, storage::JobStatus::kSucceeded) << job.status_reason;
  EXPECT_EQ(job.committed_round, kRounds);
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  const std::vector<std::string> expected_reasons = {"truncated", "declares", "not finite"};
  float expected = 0;
  for (const storage::Round& r : *rounds) {
    ASSERT_EQ(r.status, storage::RoundStatus::kCommitted) << r.failure_reason;
    expected += Delta(r.round, 0);  // only shard 0's update counts
    for (float v : WeightsValues(f.ReadBlob(r.global_blob_key))) EXPECT_NEAR(v, expected, 1e-5) << "round " << r.round;
    StatusOr<std::vector<storage::RoundUpdate>> updates = f.store_->ListUpdates(f.job_id_, r.round, r.attempt);
    ASSERT_TRUE(updates.ok());
    ASSERT_EQ(updates->size(), 2u);
    int rejected = 0;
    for (const storage::RoundUpdate& u : *updates) {
      if (u.status != storage::UpdateStatus::kRejected) continue;
      ++rejected;
      EXPECT_NE(u.reject_reason.find("compressed update (int8 delta, zstd) is invalid"), std::string::npos)
          << u.reject_reason;
      EXPECT_NE(u.reject_reason.find(expected_reasons.at(static_cast<size_t>(r.round - 1))), std::string::npos)
          << "round " << r.round << ": " << u.reject_reason;
    }
    EXPECT_EQ(rejected, 1) << "round " << r.round;
  }
}

// A store error at the n-th write after the job started, for every write of an uninterrupted run: the runner never
// runs ahead of the store (checked after every step), does not wedge, and finishes with the same global.
TEST(JobRunnerTest, StoreErrorAtEachWriteIsRetried) {
  const Reference& reference = UninterruptedRun();
  ASSERT_GT(reference.writes, 10);
  for (int n = 1; n <= reference.writes; ++n) {
    SCOPED_TRACE("write " + std::to_string(n) + " of " + std::to_string(reference.writes) + " fails");
    JobFixture f;
    f.store_->FailNthWrite(n, UnavailableError("injected store error"));
    Status started = f.StartRunner();
    if (!started.ok()) {
      // Only the setup's own writes (1: the shards, 2: the job's running status) fail the start, which says so;
      // a failed write of round 1 is retried like any other round's.
      EXPECT_LE(n, 2) << started.ToString();
      EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kFailed) << started.ToString();
      continue;
    }
    ASSERT_TRUE(f.Drive()) << "the job is wedged after the store error";
    if (f.StoredJob().status == storage::JobStatus::kRunning) {
      // The write that failed was the job's end: the store still has it running, so a restart finishes it.
      ASSERT_TRUE(f.StartRunner().ok());
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.StoredJob().committed_round, kRounds);
    EXPECT_EQ(f.CommittedGlobal(), reference.global);
    if (::testing::Test::HasFailure()) return;
  }
}

// Reports one worker's result and keeps the answer.
http::Awaitable<void> ReportResult(JobRunner& runner, int64_t worker, ResultReport report,
                                   std::map<int64_t, StatusOr<json>>& answers) {
  auto result = runner.Result(worker, std::move(report));  // kCoAwaitTemporaries
  StatusOr<json> answer = co_await std::move(result);
  answers.emplace(worker, std::move(answer));
}

// Group commit: `reporting` workers' results arrive together while the store holds its writes (a slow commit): the
// first result's batch waits in the store, the others queue behind it. `while_held` runs then; the answers are
// collected once the store lets the writes through.
std::map<int64_t, StatusOr<json>> ResultsTogether(JobFixture& f, size_t reporting,
                                                  const std::function<void()>& while_held) {
  f.Step();  // every worker picks up its task
  std::vector<std::pair<int64_t, ResultReport>> reports;
  for (auto& [worker, session] : f.host_->sessions_) {
    EXPECT_TRUE(session.current.has_value()) << "worker " << worker << " has no task";
    if (session.current && reports.size() < reporting) reports.emplace_back(worker, f.Work(*session.current));
  }
  std::map<int64_t, StatusOr<json>> answers;
  f.store_->HoldWrites();
  for (auto& [worker, report] : reports) {
    boost::asio::co_spawn(f.io_, ReportResult(*f.runner_, worker, report, answers), boost::asio::detached);
  }
  // The first result's batch reaches the store (its check and accumulation run on the pool first); the others then
  // have time to queue behind it.
  EXPECT_TRUE(f.RunUntil([&] { return f.store_->writes_held() > 0; })) << "no batch reached the store";
  f.Settle(3, std::chrono::milliseconds(20));
  EXPECT_EQ(f.store_->writes_held(), 1) << "one batch at a time";
  EXPECT_TRUE(answers.empty()) << "a result is answered only once its record is durable";
  while_held();
  f.store_->ReleaseWrites();
  while (answers.size() < reports.size()) f.io_.run_one_for(std::chrono::milliseconds(10));
  f.Settle();
  return answers;
}

// N results arriving together are recorded (update and event each) in fewer commits than N, not 2 per result.
TEST(JobRunnerTest, ResultsArrivingTogetherShareCommits) {
  constexpr size_t kReporting = 8;
  // One worker more than report, and all needed: the round stays open, so only the results' commits are counted.
  JobFixture f({{"min_workers", kReporting + 1}, {"max_workers", kReporting + 1}}, false, false, kReporting + 1);
  ASSERT_TRUE(f.StartRunner().ok());
  auto& sqlite = dynamic_cast<storage::SqliteMetadataStore&>(f.store_->inner());
  const int64_t commits_before = sqlite.commits();
  std::map<int64_t, StatusOr<json>> answers = ResultsTogether(f, kReporting, [] {});
  const int64_t commits = sqlite.commits() - commits_before;
  ASSERT_EQ(answers.size(), kReporting);
  for (const auto& [worker, answer] : answers) {
    ASSERT_TRUE(answer.ok()) << "worker " << worker << ": " << answer.status().ToString();
    EXPECT_EQ((*answer)["status"], "accepted") << answer->dump();
  }
  StatusOr<std::vector<storage::RoundUpdate>> updates = f.store_->ListUpdates(f.job_id_, 1, 1);
  ASSERT_TRUE(updates.ok());
  EXPECT_EQ(updates->size(), kReporting);
  StatusOr<std::vector<storage::JobEvent>> events = f.store_->ListJobEvents(f.job_id_, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(std::count_if(events->begin(), events->end(),
                          [](const storage::JobEvent& e) { return e.type == "update_accepted"; }),
            static_cast<std::ptrdiff_t>(kReporting));
  EXPECT_LT(commits, static_cast<int64_t>(kReporting)) << kReporting << " results in " << commits << " commits";
}

// A round start's tasks go out as their records become durable, not once the last of them is built: 6,000 tasks are
// built in slices, and the batches of the first are applied between them.
TEST(JobRunnerTest, ARoundStartsFirstTasksGoOutBeforeItsLastIsBuilt) {
  constexpr int kWorkers = 6000;
  JobFixture f({{"min_workers", kWorkers}, {"max_workers", kWorkers}}, false, false, kWorkers);
  ASSERT_TRUE(f.StartRunner().ok());
  const std::vector<int64_t>& at_delivery = f.host_->get_urls_at_delivery_;
  ASSERT_EQ(at_delivery.size(), static_cast<size_t>(kWorkers));
  const int64_t all_built = f.host_->get_urls_issued_;
  EXPECT_LT(at_delivery.front(), all_built / 2)
      << "the first task went out after " << at_delivery.front() << " of " << all_built << " GET URLs were issued";
  // Every worker got its task once, and the store holds every task's event.
  for (const auto& [worker, session] : f.host_->sessions_) EXPECT_EQ(session.queued.size(), 1u) << worker;
  StatusOr<std::vector<storage::JobEvent>> events = f.store_->ListJobEvents(f.job_id_, 0, 4 * kWorkers);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  EXPECT_EQ(std::count_if(events->begin(), events->end(),
                          [](const storage::JobEvent& e) { return e.type == "task_assigned"; }),
            kWorkers);
}

// A batch of results that the store refuses is handled as a refused single write: those results are answered with
// the error, and the job resyncs and retries the round (a new attempt), then finishes.
TEST(JobRunnerTest, RefusedBatchOfResultsRetriesTheRound) {
  constexpr size_t kWorkers = 4;
  JobFixture f({{"min_workers", kWorkers}, {"max_workers", kWorkers}}, false, false, kWorkers);
  ASSERT_TRUE(f.StartRunner().ok());
  // The held write fails: the batch with the first result (and with whichever others joined it before the store took
  // it: small updates are accepted without leaving the loop, so often all of them).
  // When every result joined the failed batch none of them is recorded: the uploads are counted while it is held.
  size_t uploaded = 0;
  std::map<int64_t, StatusOr<json>> answers = ResultsTogether(f, kWorkers, [&] {
    StatusOr<std::vector<std::string>> blobs = f.blob_store_->List(UpdatesPrefix(f, 1, 1));
    if (blobs.ok()) uploaded = blobs->size();
    f.store_->FailNthWrite(1, UnavailableError("injected store error in a batch"));
  });
  EXPECT_EQ(uploaded, kWorkers);
  // A refused result says why: the failed batch, or (one that reached the job only after the retry began, on a
  // loaded machine) the attempt it was for is over.
  int refused_by_the_batch = 0;
  for (const auto& [worker, answer] : answers) {
    if (answer.ok()) continue;
    const std::string& message = answer.status().message();
    if (message.find("injected store error in a batch") != std::string::npos) {
      ++refused_by_the_batch;
    } else {
      EXPECT_NE(message.find("the job is at round 1 attempt 2"), std::string::npos)
          << "worker " << worker << ": " << answer.status().ToString();
    }
  }
  EXPECT_GE(refused_by_the_batch, 1);
  ASSERT_TRUE(f.Drive()) << "the job is wedged after the failed batch";
  EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
  EXPECT_EQ(f.StoredJob().committed_round, kRounds);
  StatusOr<storage::Round> first = f.store_->GetRound(f.job_id_, 1, 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->status, storage::RoundStatus::kFailed);
  EXPECT_NE(first->failure_reason.find("injected store error in a batch"), std::string::npos) << first->failure_reason;
  EXPECT_TRUE(BlobsGoneUnder(f, UpdatesPrefix(f, 1, 1))) << "the failed attempt's updates are left";
}

// A store outage (a run of failing writes) in the middle of a round: events are refused meanwhile, the retry on the
// timer fails until the store is back, then the round is retried and the job finishes with the same global.
TEST(JobRunnerTest, StoreOutageIsRetriedOnTheTimer) {
  for (int failing_writes : {2, 5, 12}) {
    SCOPED_TRACE(std::to_string(failing_writes) + " writes fail");
    JobFixture f;
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= 1; }));
    f.store_->FailNextWrites(failing_writes, UnavailableError("injected store outage"));
    ASSERT_TRUE(f.Drive()) << "the job is wedged after the store outage";
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.StoredJob().committed_round, kRounds);
    EXPECT_EQ(f.CommittedGlobal(), UninterruptedRun().global);
  }
}

// A full disk (what both stores return for ENOSPC, storage/disk_full.h) in the middle of a round: the job's live view
// says so while nothing can be recorded; once writes pass again, the round's attempt is failed with that reason and
// retried, and the job finishes with the uninterrupted global. (The e2e test fills a real file system.)
TEST(JobRunnerTest, DiskFullIsShownWhileItLastsAndRecordedAsTheRoundsFailure) {
  JobFixture f;
  ASSERT_TRUE(f.StartRunner().ok());
  ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= 1; }));
  f.store_->FailNextWrites(6, storage::DiskFullError("/data/metadata.db", "committing: database or disk is full"));
  std::string shown;
  ASSERT_TRUE(f.Drive([&] {
    if (shown.empty()) shown = f.runner_->LiveView().value("store_error", "");
    return false;
  }));
  EXPECT_NE(shown.find("disk full: /data/metadata.db"), std::string::npos) << shown;
  EXPECT_NE(shown.find("free space and the job resumes"), std::string::npos) << shown;
  EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
  EXPECT_EQ(f.CommittedGlobal(), UninterruptedRun().global);
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  int failed_for_disk = 0;
  for (const storage::Round& r : *rounds) {
    if (r.status == storage::RoundStatus::kFailed && r.failure_reason.find("disk full") != std::string::npos) {
      failed_for_disk++;
    }
  }
  EXPECT_GE(failed_for_disk, 1);
}

// A coordinator restart after each committed round: a new runner on the same stores resumes at the last committed
// round and finishes with the global of an uninterrupted run.
TEST(JobRunnerTest, RestartFromEachCheckpointFinishesTheSame) {
  for (int checkpoint = 0; checkpoint <= kRounds; ++checkpoint) {
    SCOPED_TRACE("restart after round " + std::to_string(checkpoint));
    JobFixture f;
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= checkpoint; }));
    if (!f.runner_->finished()) {
      ASSERT_TRUE(f.StartRunner().ok());  // the attempt in flight is failed; the next round's attempt starts
      EXPECT_EQ(f.runner_->LiveView().value("committed_round", -1), checkpoint);
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.StoredJob().committed_round, kRounds);
    EXPECT_EQ(f.CommittedGlobal(), UninterruptedRun().global);
  }
}

// Early stopping with patience 2 over 6 rounds: globals 3 and 4 do not improve on global 2, so the job ends after
// round 5 (whose commit brought global 4's loss) with the final evaluation of global 5, succeeded, and keeps
// best/model.safetensors = round 2's global beside model.safetensors = round 5's. The same with a coordinator
// restart in the middle (the count is rebuilt from the stored losses) and during the final evaluation.
TEST(JobRunnerTest, EarlyStoppingEndsTheJobAndKeepsTheBestGlobal) {
  for (int restart_after : {0, 3, 5}) {
    SCOPED_TRACE("restart after round " + std::to_string(restart_after));
    JobFixture f({{"num_rounds", 6}, {"early_stopping", {{"patience", 2}, {"min_delta", 0.01}}}});
    const std::map<int, double> losses = {{0, 3.0}, {1, 2.0}, {2, 1.0}, {3, 1.5}, {4, 0.995}, {5, 1.1}, {6, 0.1}};
    f.validation_loss_ = [&](int global_round) { return losses.at(global_round); };
    ASSERT_TRUE(f.StartRunner().ok());
    if (restart_after > 0) {
      ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= restart_after; }));
      ASSERT_FALSE(f.runner_->finished());
      ASSERT_TRUE(f.StartRunner().ok());
    }
    ASSERT_TRUE(f.Drive());
    const storage::TrainingJob job = f.StoredJob();
    EXPECT_EQ(job.status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(job.committed_round, 5);
    EXPECT_EQ(job.status_reason,
              "stopped early after round 5 of 6: the validation loss did not improve by more than min_delta 0.01 for "
              "2 evaluated global(s) in a row (patience); lowest validation loss 0.995, after round 4");
    EXPECT_EQ(job.initial_validation_loss, 3.0);
    EXPECT_EQ(job.final_validation_loss, 1.1);
    EXPECT_EQ(job.best_round, 4);  // 0.995: the lowest, though not lower than round 2's 1.0 by more than min_delta
    EXPECT_EQ(job.best_validation_loss, 0.995);

    StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
    ASSERT_TRUE(rounds.ok());
    std::map<int, std::string> committed_sha;
    for (const storage::Round& r : *rounds) {
      if (r.status != storage::RoundStatus::kCommitted) continue;
      committed_sha[r.round] = r.global_sha256;
      EXPECT_EQ(r.validation_loss, losses.at(r.round)) << "round " << r.round;
    }
    ASSERT_EQ(committed_sha.size(), 5u);
    StatusOr<std::vector<storage::JobArtifact>> artifacts = f.store_->ListJobArtifacts(f.job_id_);
    ASSERT_TRUE(artifacts.ok());
    std::map<std::string, std::string> sha_by_name;
    for (const storage::JobArtifact& a : *artifacts) sha_by_name[a.name] = a.sha256;
    EXPECT_EQ(sha_by_name["best/model.safetensors"], committed_sha[4]);
    EXPECT_EQ(sha_by_name["model.safetensors"], committed_sha[5]);
    EXPECT_NE(committed_sha[4], committed_sha[5]);
  }
}

// Setup puts every shard's two files into one directory (10,000 directories, one per shard, made a 10,000-worker
// job's setup twice as slow), and a job set up with the older layout (a directory per shard) still finds its
// validation files after an upgrade.
TEST(JobRunnerTest, ShardFilesShareOneDirectoryAndOlderKeysStillResolve) {
  JobFixture f;
  ASSERT_TRUE(f.StartRunner().ok());
  StatusOr<std::vector<storage::Shard>> shards = f.store_->ListShards(f.job_id_);
  ASSERT_TRUE(shards.ok());
  ASSERT_FALSE(shards->empty());
  const std::string dir = "jobs/" + std::to_string(f.job_id_) + "/shards/";
  StatusOr<std::vector<std::string>> listed = f.blob_store_->List(dir);
  ASSERT_TRUE(listed.ok());
  const std::set<std::string> keys(listed->begin(), listed->end());
  EXPECT_EQ(keys.size(), 2 * shards->size());
  for (const storage::Shard& s : *shards) {
    EXPECT_EQ(s.blob_key, fmt::format("{}{:05}.train.csv", dir, s.shard_index));
    EXPECT_EQ(ValidationKey(s, storage::DatasetFormat::kCsv),
              fmt::format("{}{:05}.validation.csv", dir, s.shard_index));
    EXPECT_TRUE(keys.contains(ValidationKey(s, storage::DatasetFormat::kCsv)));
  }
  storage::Shard older;
  older.blob_key = "jobs/7/shards/042/train.jsonl";
  EXPECT_EQ(ValidationKey(older, storage::DatasetFormat::kJsonl), "jobs/7/shards/042/validation.jsonl");
}

// data.source "workers": setup writes no shard data, the tasks send the workers to their own files, each update
// weighs the samples its worker reports, the uneven sizes give one warning, and a restart mid-job finishes the same.
TEST(JobRunnerTest, JobOverTheWorkersOwnDataWeighsTheirReportedSamples) {
  std::vector<std::byte> uninterrupted;
  for (int restart_after : {-1, 1}) {
    SCOPED_TRACE(restart_after < 0 ? "uninterrupted" : "restart after round 1");
    JobFixture f(json::object(), /*own_data=*/true);
    ASSERT_TRUE(f.StartRunner().ok());
    StatusOr<std::vector<storage::Shard>> shards = f.store_->ListShards(f.job_id_);
    ASSERT_TRUE(shards.ok());
    ASSERT_EQ(shards->size(), 2u);
    for (const storage::Shard& s : *shards) EXPECT_EQ(s.blob_key, "") << "a slot, without data";
    EXPECT_TRUE(f.blob_store_->List("jobs/" + std::to_string(f.job_id_) + "/shards/")->empty());
    if (restart_after > 0) {
      ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= restart_after; }));
      ASSERT_TRUE(f.StartRunner().ok());
    }
    ASSERT_TRUE(f.Drive());
    ASSERT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);

    StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
    ASSERT_TRUE(rounds.ok());
    float expected = 0;
    for (const storage::Round& r : *rounds) {
      if (r.status != storage::RoundStatus::kCommitted) continue;
      // Shard (slot) i belongs to listed worker i: 100 and 500 samples.
      expected += static_cast<float>((100.0 * Delta(r.round, 0) + 500.0 * Delta(r.round, 1)) / 600.0);
      for (float v : WeightsValues(f.ReadBlob(r.global_blob_key))) EXPECT_NEAR(v, expected, 1e-5) << r.round;
    }
    if (restart_after < 0) {
      uninterrupted = f.CommittedGlobal();
    } else {
      EXPECT_EQ(f.CommittedGlobal(), uninterrupted);
    }
    StatusOr<std::vector<storage::JobEvent>> events = f.store_->ListJobEvents(f.job_id_, 0);
    ASSERT_TRUE(events.ok());
    int warnings = 0;
    for (const storage::JobEvent& e : *events) {
      if (e.type != "warning") continue;
      ++warnings;
      EXPECT_NE(e.payload_json.find("500 training samples"), std::string::npos) << e.payload_json;
    }
    EXPECT_EQ(warnings, 1) << "once per job, also across a restart";
  }
}

// Only the job's project's own workers (and managed ones) train it: another project's worker, online and listed
// first, gets no task.
TEST(JobRunnerTest, AnotherProjectsWorkerTakesNoPart) {
  JobFixture f(json::object(), /*own_data=*/false, /*directory_blobs=*/false, /*workers=*/3);
  const int64_t other = f.host_->sessions_.begin()->first;  // the lowest id: the first one offered
  f.host_->worker_projects_[other] = storage::kDefaultProjectId + 1;
  ASSERT_TRUE(f.StartRunner().ok());
  ASSERT_TRUE(f.Drive());
  ASSERT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  ASSERT_FALSE(rounds->empty());
  for (const storage::Round& r : *rounds) {
    EXPECT_EQ(std::count(r.participants.begin(), r.participants.end(), other), 0) << "round " << r.round;
  }
}

// A non-IID partition's shard sizes are known only when the job is set up: there, not at create time, a split more
// than 4x uneven gets its warning event (an even one gets none).
TEST(JobRunnerTest, SkewedPartitionWarnsOfUnevenShardsAtSetup) {
  for (double alpha : {0.2, 1000.0}) {
    SCOPED_TRACE("alpha " + std::to_string(alpha));
    JobFixture f(json{{"partition", {{"method", "dirichlet"}, {"alpha", alpha}}}});
    ASSERT_TRUE(f.StartRunner().ok());
    StatusOr<std::vector<storage::Shard>> shards = f.store_->ListShards(f.job_id_);
    ASSERT_TRUE(shards.ok());
    ASSERT_EQ(shards->size(), 2u);
    const int64_t smallest = std::min((*shards)[0].train_rows, (*shards)[1].train_rows);
    const int64_t largest = std::max((*shards)[0].train_rows, (*shards)[1].train_rows);
    // The seeded split (pinned): Dir(0.2) leaves one worker few rows, Dir(1000) splits each class evenly.
    ASSERT_EQ(largest > 4 * smallest, alpha < 1) << smallest << " and " << largest << " rows";
    StatusOr<std::vector<storage::JobEvent>> events = f.store_->ListJobEvents(f.job_id_, 0);
    ASSERT_TRUE(events.ok());
    int warnings = 0;
    for (const storage::JobEvent& e : *events) {
      if (e.type == "warning" && e.payload_json.find("differ more than 4x") != std::string::npos) ++warnings;
    }
    EXPECT_EQ(warnings, alpha < 1 ? 1 : 0);
  }
}

// A committed global whose bytes were changed on disk while the coordinator was down (the directory store's file;
// its recorded checksum stays) is refused on restart: the job fails with a reason naming the blob, the sha256 the
// metadata store recorded and the one the file has now, and no task goes out with it.
TEST(JobRunnerTest, RestartRefusesACommittedGlobalChangedOnDisk) {
  JobFixture f(json::object(), false, /*directory_blobs=*/true);
  ASSERT_TRUE(f.StartRunner().ok());
  ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= 1; }));
  const int committed = f.StoredJob().committed_round;
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  std::string key, recorded;
  for (const storage::Round& r : *rounds) {
    if (r.round == committed && r.status == storage::RoundStatus::kCommitted) {
      key = r.global_blob_key;
      recorded = r.global_sha256;
    }
  }
  ASSERT_FALSE(key.empty());
  StatusOr<std::filesystem::path> file = f.blob_store_->LocalPath(key);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  // Still a valid safetensors file, with one weight changed.
  std::vector<std::byte> bytes = f.ReadBlob(key);
  ASSERT_FALSE(bytes.empty());
  bytes.back() ^= std::byte{0x40};
  std::filesystem::permissions(*file, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  std::ofstream(*file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const std::string actual = Sha256Hex(std::span<const std::byte>(bytes));
  ASSERT_EQ(f.blob_store_->Head(key)->sha256, recorded) << "the store's own record still says the old checksum";

  const Status restarted = f.StartRunner();
  const std::string expected_message = "the global weights " + key + " have sha256 " + actual +
                                       ", but the metadata store recorded " + recorded +
                                       ": the blob changed after it was written; the job does not train on it";
  EXPECT_EQ(restarted.code(), StatusCode::kDataLoss) << restarted.ToString();
  EXPECT_EQ(restarted.message(), expected_message);
  const storage::TrainingJob job = f.StoredJob();
  EXPECT_EQ(job.status, storage::JobStatus::kFailed);
  EXPECT_EQ(job.failure_reason, "could not start: " + expected_message);
  for (const auto& [worker, session] : f.host_->sessions_) EXPECT_TRUE(session.queued.empty());
}

// A job that cannot start says why to its users without the server's file paths (the log keeps them whole), and
// what to do: it has failed for good, so a full disk's advice is to create it again.
TEST(JobRunnerTest, ACouldNotStartReasonNamesNoServerPath) {
  JobFixture f;
  ASSERT_NE(f.memory_blobs_, nullptr);
  f.memory_blobs_->FailNextPuts(
      1, storage::DiskFullError("/srv/parsyn/blobs/jobs/1/rounds/000000/global.safetensors", "writing: No space left"));
  const Status started = f.StartRunner();
  EXPECT_FALSE(started.ok());
  EXPECT_NE(started.message().find("/srv/parsyn/blobs/"), std::string::npos) << started.ToString();
  const storage::TrainingJob job = f.StoredJob();
  EXPECT_EQ(job.status, storage::JobStatus::kFailed);
  EXPECT_EQ(job.failure_reason,
            "could not start: disk full: global.safetensors (writing: No space left), free space and create the job "
            "again");  // a job that could not start does not resume
  EXPECT_EQ(job.failure_reason.find("/srv/"), std::string::npos) << job.failure_reason;
}

// A server optimizer's moments (fedadam) persist across rounds and coordinator restarts: a restart after each round,
// and a store error at each write, finish with the uninterrupted run's global, bit for bit (which is not FedAvg's).
TEST(JobRunnerTest, ServerOptimizerStateSurvivesRestartsAndStoreErrors) {
  const json fedadam = {{"strategy", "fedadam"}, {"strategy_options", {{"server_learning_rate", 0.05}}}};
  std::vector<std::byte> reference;
  int writes = 0;
  {
    JobFixture f(fedadam);
    const int before = f.store_->writes_passed();
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive());
    writes = f.store_->writes_passed() - before;
    ASSERT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    reference = f.CommittedGlobal();
    EXPECT_NE(reference, UninterruptedRun().global) << "fedadam's global is FedAvg's";
    // Each committed global names the server state stored beside it.
    StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
    ASSERT_TRUE(rounds.ok());
    for (const storage::Round& r : *rounds) {
      if (r.status != storage::RoundStatus::kCommitted || r.round < 1) continue;
      StatusOr<weights::WeightSet> global = weights::ParseSafetensors(f.ReadBlob(r.global_blob_key));
      ASSERT_TRUE(global.ok()) << global.status().ToString();
      const std::string state_key =
          r.global_blob_key.substr(0, r.global_blob_key.rfind('/') + 1) + "server_state.safetensors";
      EXPECT_EQ(global->metadata()["parsyn_server_state_sha256"], f.blob_store_->Head(state_key)->sha256);
    }
  }
  for (int checkpoint = 0; checkpoint <= kRounds; ++checkpoint) {
    SCOPED_TRACE("restart after round " + std::to_string(checkpoint));
    JobFixture f(fedadam);
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= checkpoint; }));
    if (!f.runner_->finished()) {
      ASSERT_TRUE(f.StartRunner().ok());
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.CommittedGlobal(), reference);
  }
  for (int n = 3; n <= writes; ++n) {
    SCOPED_TRACE("write " + std::to_string(n) + " of " + std::to_string(writes) + " fails");
    JobFixture f(fedadam);
    f.store_->FailNthWrite(n, UnavailableError("injected store error"));
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive()) << "the job is wedged after the store error";
    if (f.StoredJob().status == storage::JobStatus::kRunning) {
      ASSERT_TRUE(f.StartRunner().ok());
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.CommittedGlobal(), reference);
    if (::testing::Test::HasFailure()) return;
  }
}

// dp_fedavg's privacy accounting is server state: a restart after each round, and a store error at each write (a
// retried round), finish with the uninterrupted run's global and ε bit for bit, and each round_committed event
// reports the ε of the rounds committed so far (a retried round counts once).
TEST(JobRunnerTest, DpAccountingSurvivesRestartsAndCountsRetriedRoundsOnce) {
  const json dp = {{"strategy", "dp_fedavg"},
                   {"strategy_options", {{"clip_norm", 0.05}, {"noise_multiplier", 1.3}, {"delta", 1e-5}}}};
  // ε of the last committed round, from the state stored beside the final global, and from the events.
  auto final_epsilon = [](JobFixture& f) {
    StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
    EXPECT_TRUE(rounds.ok());
    for (const storage::Round& r : *rounds) {
      if (r.round != kRounds || r.status != storage::RoundStatus::kCommitted) continue;
      const std::string key =
          r.global_blob_key.substr(0, r.global_blob_key.rfind('/') + 1) + "server_state.safetensors";
      StatusOr<weights::WeightSet> state = weights::ParseSafetensors(f.ReadBlob(key));
      EXPECT_TRUE(state.ok());
      if (state.ok()) return state->Find("epsilon")->as<double>()[0];
    }
    ADD_FAILURE() << "no committed final round";
    return -1.0;
  };
  std::vector<std::byte> reference;
  double reference_epsilon = 0;
  int writes = 0;
  {
    JobFixture f(dp);
    const int before = f.store_->writes_passed();
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive());
    writes = f.store_->writes_passed() - before;
    ASSERT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    reference = f.CommittedGlobal();
    EXPECT_NE(reference, UninterruptedRun().global) << "dp_fedavg's global is FedAvg's";
    reference_epsilon = final_epsilon(f);
    // Two shards, two participants: q = 1, the plain Gaussian mechanism composed kRounds times.
    EXPECT_EQ(reference_epsilon, strategy::EpsilonAfter(kRounds, 1.0, 1.3, 1e-5));
    StatusOr<std::vector<storage::JobEvent>> events = f.store_->ListJobEvents(f.job_id_, 0, 10000);
    ASSERT_TRUE(events.ok());
    int committed = 0;
    for (const storage::JobEvent& e : *events) {
      if (e.type != "round_committed") continue;
      const json data = json::parse(e.payload_json);
      ++committed;
      ASSERT_TRUE(data.contains("privacy")) << data.dump();
      EXPECT_EQ(data["privacy"]["epsilon"].get<double>(), strategy::EpsilonAfter(committed, 1.0, 1.3, 1e-5));
      EXPECT_EQ(data["privacy"]["sampling_rate"], 1.0);
      EXPECT_EQ(data["privacy"]["participants"], 2);
      EXPECT_EQ(data["privacy"]["noise_stddev"].get<double>(), 1.3 * 0.05 / 2);
    }
    EXPECT_EQ(committed, kRounds);
  }
  for (int checkpoint = 0; checkpoint <= kRounds; ++checkpoint) {
    SCOPED_TRACE("restart after round " + std::to_string(checkpoint));
    JobFixture f(dp);
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= checkpoint; }));
    if (!f.runner_->finished()) {
      ASSERT_TRUE(f.StartRunner().ok());
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.CommittedGlobal(), reference);
    EXPECT_EQ(final_epsilon(f), reference_epsilon);
  }
  for (int n = 3; n <= writes; ++n) {
    SCOPED_TRACE("write " + std::to_string(n) + " of " + std::to_string(writes) + " fails");
    JobFixture f(dp);
    f.store_->FailNthWrite(n, UnavailableError("injected store error"));
    ASSERT_TRUE(f.StartRunner().ok());
    ASSERT_TRUE(f.Drive()) << "the job is wedged after the store error";
    if (f.StoredJob().status == storage::JobStatus::kRunning) {
      ASSERT_TRUE(f.StartRunner().ok());
      ASSERT_TRUE(f.Drive());
    }
    EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kSucceeded);
    EXPECT_EQ(f.CommittedGlobal(), reference);
    EXPECT_EQ(final_epsilon(f), reference_epsilon);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(JobRunnerTest, RestartRefusesAServerStateChangedOnDisk) {
  JobFixture f({{"strategy", "fedyogi"}}, false, /*directory_blobs=*/true);
  ASSERT_TRUE(f.StartRunner().ok());
  ASSERT_TRUE(f.Drive([&] { return f.StoredJob().committed_round >= 1; }));
  const int committed = f.StoredJob().committed_round;
  StatusOr<std::vector<storage::Round>> rounds = f.store_->ListRounds(f.job_id_);
  ASSERT_TRUE(rounds.ok());
  std::string key;
  for (const storage::Round& r : *rounds) {
    if (r.round == committed && r.status == storage::RoundStatus::kCommitted) {
      key = r.global_blob_key.substr(0, r.global_blob_key.rfind('/') + 1) + "server_state.safetensors";
    }
  }
  ASSERT_FALSE(key.empty());
  StatusOr<std::filesystem::path> file = f.blob_store_->LocalPath(key);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<std::byte> bytes = f.ReadBlob(key);
  ASSERT_FALSE(bytes.empty());
  bytes.back() ^= std::byte{0x40};  // one moment changed; still a valid safetensors file
  std::filesystem::permissions(*file, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  std::ofstream(*file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));

  const Status restarted = f.StartRunner();
  EXPECT_EQ(restarted.code(), StatusCode::kDataLoss) << restarted.ToString();
  EXPECT_NE(restarted.message().find(key), std::string::npos) << restarted.message();
  EXPECT_EQ(f.StoredJob().status, storage::JobStatus::kFailed);
}

}  // namespace
}  // namespace parsyn::coordinator
