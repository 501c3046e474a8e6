#include "simulation/simulation.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <memory>

#include "base/clock.h"
#include "base/log.h"
#include "coordinator/job_host.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_spec.h"
#include "loop/loop_tools.h"
#include "protocol/messages.h"
#include "protocol/training_config.h"
#include "simulation/simulation_setup.h"
#include "simulation/virtual_secure.h"
#include "simulation/virtual_task.h"
#include "simulation/worker_speeds.h"
#include "storage/directory_blob_store.h"
#include "storage/sqlite_store.h"
#include "worker/agent.h"

namespace parsyn::simulation {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// How often the loop applies the runner's timeouts (Tick) and reports progress.
constexpr std::chrono::milliseconds kTickInterval{200};
// How often virtual workers of a secure attempt look for the end of the phase they wait for.
constexpr std::chrono::milliseconds kSecureStepInterval{10};

class SimulationBlobUrls final : public storage::BlobUrlIssuer {
 public:
  StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds) const override {
    return std::string(kUrlScheme) + std::string(key);
  }
  StatusOr<storage::UrlGrant> PutGrant(std::string_view key, std::chrono::seconds) const override {
    return storage::UrlGrant{.url = std::string(kUrlScheme) + std::string(key), .headers = {}};
  }
  std::chrono::seconds max_ttl() const override { return std::chrono::hours(24 * 7); }
  bool transfers_bypass_coordinator() const override { return true; }
};

// The JobHost of a simulation: the stores of the output folder, the loop, and the virtual workers.
class SimulationHost final : public coordinator::JobHost {
 public:
  SimulationHost(const SimulationOptions& options, worker::TrainerLauncher& launcher, storage::MetadataStore& store,
                 storage::BlobStore& blobs, fs::path work_dir, uint64_t seed)
      : options_(options),
        secure_(options.dropout, seed),
        tasks_(options, launcher, store, blobs, work_dir),
        store_(store),
        blobs_(blobs),
        work_dir_(std::move(work_dir)),
        pool_(2),
        trainers_(static_cast<size_t>(std::max(1, options.parallel))),
        writes_(io_.get_executor(), pool_, store) {}
  ~SimulationHost() override {
    trainers_.join();
    pool_.join();
  }

  void AddWorker(int64_t id) { workers_[id] = VirtualWorker{}; }
  // An asynchronous job with --speeds: results reach the runner in virtual-time order (VirtualSchedule), and each
  // attempt's virtual end is measured as it commits or fails (measured_ends).
  void TimeAsynchronousRounds(std::map<int64_t, double> step_seconds, int64_t steps_per_task) {
    schedule_.emplace(std::move(step_seconds), steps_per_task);
  }
  const std::map<std::pair<int, int>, double>& measured_ends() const { return measured_ends_; }
  void set_runner(coordinator::JobRunner* runner) { runner_ = runner; }
  boost::asio::io_context& io() { return io_; }

  storage::MetadataStore& store() override { return store_; }
  storage::BlobStore& blobs() override { return blobs_; }
  storage::BlobUrlIssuer& blob_urls() override { return urls_; }
  std::string BlobGetUrl(std::string_view key, std::chrono::seconds ttl, int64_t) const override {
    return *urls_.GetUrl(key, ttl);
  }
  StatusOr<storage::UrlGrant> BlobPutGrant(std::string_view key, std::chrono::seconds ttl, int64_t) const override {
    return urls_.PutGrant(key, ttl);
  }
  std::chrono::seconds TaskUrlTtl(std::chrono::milliseconds attempt_timeout) const override {
    return std::min(urls_.max_ttl(), std::chrono::duration_cast<std::chrono::seconds>(attempt_timeout) +
                                         std::chrono::seconds(coordinator::kTaskUrlMargin));
  }
  boost::asio::thread_pool& pool() override { return pool_; }
  boost::asio::any_io_executor executor() override { return io_.get_executor(); }
  const Clock& clock() const override { return clock_; }
  fs::path spool_dir() const override { return work_dir_ / "spool"; }
  bool keep_updates() const override { return false; }  // a simulation's blobs go with its work dir anyway

  http::Awaitable<void> AppendEvent(int64_t job_id, std::string type, json payload) override {
    if (schedule_ && (type == "round_committed" || type == "round_failed")) {
      measured_ends_[{payload.value("round", 0), payload.value("attempt", 0)}] = schedule_->now();
    }
    storage::JobEvent event{
        .job_id = job_id, .type = type, .payload_json = payload.dump(), .time_ms = clock_.UnixMillis()};
    StatusOr<int64_t> id = co_await loop::Offload(pool_, [&] { return store_.AppendJobEvent(event); });
    if (!id.ok()) PARSYN_LOG_ERROR("training job {}: event {} not stored: {}", job_id, type, id.status().ToString());
  }
  // Group commit as the server does it (coordinator/write_queue.h).
  coordinator::WriteQueue::TicketPtr QueueJobWrites(int64_t job_id, std::vector<storage::BatchWrite> records,
                                                    std::vector<QueuedEvent> events) override {
    for (QueuedEvent& e : events) {
      records.push_back(storage::JobEvent{
          .job_id = job_id, .type = e.type, .payload_json = e.payload.dump(), .time_ms = clock_.UnixMillis()});
    }
    return writes_.Queue(std::move(records));
  }

  // The task starts at once on the trainer pool (a real worker would pick it up with its pending long-poll).
  bool DeliverTask(int64_t worker_id, int64_t, coordinator::TaskMessage task) override {
    auto it = workers_.find(worker_id);
    if (it == workers_.end()) return false;
    VirtualWorker& w = it->second;
    w.busy = true;
    w.tasks_assigned++;
    w.round = task.round;
    w.attempt = task.attempt;
    w.control = std::make_shared<TaskControl>();
    if (w.round != progress_round_) {
      progress_round_ = w.round;
      tasks_started_ = tasks_done_ = 0;
    }
    tasks_started_++;
    in_flight_++;
    if (schedule_) schedule_->Start(worker_id);
    // A securely aggregated task: the worker joins the attempt now, on the loop (it advertises its keys).
    std::shared_ptr<SecureMasking> masking = JoinSecureAttempt(worker_id, task);
    boost::asio::post(trainers_, [this, worker_id, task = std::move(task), control = w.control, masking]() mutable {
      // Read on the trainer's thread, as a worker reads its poll's answer (unreadable: ParseTask says so).
      auto outcome = std::make_shared<TaskOutcome>(
          tasks_.Run(worker_id, json::parse(task.json, nullptr, false), *control, masking.get()));
      boost::asio::co_spawn(io_, Finished(worker_id, task.round, task.attempt, outcome), boost::asio::detached);
    });
    return true;
  }

  void AbandonTask(int64_t worker_id, int64_t, int round, int attempt) override {
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || !it->second.control || it->second.round != round || it->second.attempt != attempt) {
      return;
    }
    it->second.control->abandoned.request_stop();  // the supervisor stops the trainer
  }

  void TaskFinished(int64_t, int64_t) override {}

  std::vector<int64_t> IdleWorkers() const override {
    std::vector<int64_t> idle;
    for (const auto& [id, w] : workers_) {
      if (!w.busy) idle.push_back(id);
    }
    return idle;
  }
  bool WorkerHasLocalData(int64_t) const override { return false; }
  // Every virtual worker runs the simulation's one trainer, whatever the job names.
  bool WorkerOffersTrainer(int64_t, std::string_view, std::string_view) const override { return true; }
  bool WorkerServesProject(int64_t, int64_t) const override { return true; }  // one project
  coordinator::WorkerCapacity AnnouncedCapacity(int64_t) const override { return {}; }

  // Offers every idle worker to the job (after its launch, and as workers report).
  http::Awaitable<void> OfferIdle() {
    for (int64_t id : IdleWorkers()) {
      auto offered = Offer(id);  // kCoAwaitTemporaries (loop_tools.h)
      co_await std::move(offered);
    }
  }

  // Ticks the runner until its job has ended (or could not be launched) and no trainer is still running; the loop
  // then runs out of work and RunSimulation goes on.
  http::Awaitable<void> TickLoop() {
    boost::asio::steady_timer timer(io_);
    while (!((runner_->finished() || launch_failed_) && in_flight_ == 0)) {
      timer.expires_after(kTickInterval);
      co_await timer.async_wait(boost::asio::use_awaitable);
      if (runner_->TickDue()) {
        auto ticked = runner_->Tick();
        co_await std::move(ticked);
      }
      Report();
    }
  }
  void set_launch_failed() { launch_failed_ = true; }

  // Moves the virtual workers of a secure attempt through its phases (VirtualSecureAggregation::Step) until the job
  // ends; a worker that drops out where its task must fail has it failed, as a lost worker's would. Apart from
  // TickLoop: an aggregation waiting for the survivors' shares holds the runner's Tick.
  http::Awaitable<void> SecureLoop() {
    boost::asio::steady_timer timer(io_);
    while (!((runner_->finished() || launch_failed_) && in_flight_ == 0)) {
      timer.expires_after(kSecureStepInterval);
      co_await timer.async_wait(boost::asio::use_awaitable);
      for (const VirtualSecureAggregation::Dropout& d : secure_.Step(*runner_, clock_.Now())) {
        auto it = workers_.find(d.worker);
        if (it != workers_.end() && it->second.control && it->second.round == d.round &&
            it->second.attempt == d.attempt) {
          it->second.control->abandoned.request_stop();  // its trainer stops; its outcome is not reported
        }
        auto failed = runner_->TaskFailed(d.worker, d.round, d.attempt, d.reason);  // kCoAwaitTemporaries
        Status recorded = co_await std::move(failed);
        if (!recorded.ok()) PARSYN_LOG_DEBUG("sim worker {}: dropout not recorded: {}", d.worker, recorded.message());
      }
    }
  }

 private:
  struct HeldReport {
    int round = 0;
    int attempt = 0;
    std::shared_ptr<TaskOutcome> outcome;
  };
  struct VirtualWorker {
    bool busy = false;
    uint64_t tasks_assigned = 0;  // tells a stale offer (Service::OfferWorker does the same)
    int round = 0;
    int attempt = 0;
    std::shared_ptr<TaskControl> control;
  };

  // The worker's part in the task's secure attempt (null for another task); a worker that cannot join gets a
  // SecureMasking that says why, and its task fails with it.
  std::shared_ptr<SecureMasking> JoinSecureAttempt(int64_t worker_id, const coordinator::TaskMessage& task) {
    const json parsed = json::parse(task.json, nullptr, false);
    if (!parsed.is_object() || !parsed.value("secure_aggregation", false)) return nullptr;
    StatusOr<std::shared_ptr<SecureMasking>> joined =
        secure_.Join(*runner_, worker_id, task.round, task.attempt, clock_.Now());
    if (joined.ok()) return *joined;
    auto refused = std::make_shared<SecureMasking>();
    refused->Refuse(joined.status().WithContext("joining the round's secure aggregation"));
    return refused;
  }

  http::Awaitable<void> Offer(int64_t worker_id) {
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || it->second.busy || runner_->finished()) co_return;
    auto still_idle = [this, worker_id, assigned = it->second.tasks_assigned] {
      auto found = workers_.find(worker_id);
      return found != workers_.end() && !found->second.busy && found->second.tasks_assigned == assigned;
    };
    auto available = runner_->WorkerAvailable(worker_id, std::move(still_idle));  // kCoAwaitTemporaries
    co_await std::move(available);
  }

  // On the loop: the worker's trainer is done. Its outcome is reported at once, or, in virtual time, once no task still
  // training would end before it (in the order of their virtual ends).
  http::Awaitable<void> Finished(int64_t worker_id, int round, int attempt, std::shared_ptr<TaskOutcome> outcome) {
    if (!schedule_) {
      auto reported = Reported(worker_id, round, attempt, std::move(outcome));  // kCoAwaitTemporaries
      co_await std::move(reported);
      co_return;
    }
    held_[worker_id] = HeldReport{.round = round, .attempt = attempt, .outcome = std::move(outcome)};
    schedule_->Finished(worker_id);
    if (releasing_) co_return;  // the loop below takes it in its turn
    releasing_ = true;
    while (std::optional<int64_t> next = schedule_->Release()) {
      HeldReport h = std::move(held_.at(*next));
      held_.erase(*next);
      auto reported = Reported(*next, h.round, h.attempt, std::move(h.outcome));  // kCoAwaitTemporaries
      co_await std::move(reported);
    }
    releasing_ = false;
  }

  // On the loop: the task's result (or failure) goes to the runner as the worker protocol's routes pass it, then the
  // worker is idle and offered again.
  http::Awaitable<void> Reported(int64_t worker_id, int round, int attempt, std::shared_ptr<TaskOutcome> outcome) {
    in_flight_--;
    VirtualWorker& w = workers_[worker_id];
    const bool abandoned = w.control == nullptr || w.control->abandoned.stop_requested();
    if (!abandoned) {
      runner_->AddBytesDown(outcome->bytes_down);
      if (outcome->result.ok()) {
        secure_.InputSent(worker_id);  // its masked input is in the result: it reveals once the survivors are known
        auto result = runner_->Result(worker_id, coordinator::ToResultReport(std::move(*outcome->result)));
        StatusOr<json> verdict = co_await std::move(result);
        if (!verdict.ok()) {
          PARSYN_LOG_WARN("sim worker {}: round {} result not taken: {}", worker_id, round, verdict.status().message());
        } else if (verdict->is_object() && verdict->value("status", "") == "rejected") {
          PARSYN_LOG_WARN("sim worker {}: round {} update rejected: {}", worker_id, round,
                          verdict->value("reason", ""));
        }
      } else {
        PARSYN_LOG_WARN("sim worker {}: round {} task failed: {}", worker_id, round,
                        outcome->result.status().message());
        auto failed = runner_->TaskFailed(worker_id, round, attempt,
                                          "the worker's task failed: " + outcome->result.status().message());
        Status recorded = co_await std::move(failed);
        if (!recorded.ok()) PARSYN_LOG_DEBUG("sim worker {}: failure not recorded: {}", worker_id, recorded.message());
      }
    }
    if (round == progress_round_) tasks_done_++;
    w.busy = false;
    w.control.reset();
    Report();
    auto offered = Offer(worker_id);
    co_await std::move(offered);
  }

  void Report() {
    if (!options_.on_progress) return;
    const json view = runner_->LiveView();
    if (!view.is_object()) return;
    SimulationProgress p{.phase = view.value("phase", ""),
                         .round = view.value("round", 0),
                         .total_rounds = view.value("total_rounds", 0),
                         .committed_round = view.value("committed_round", 0),
                         .tasks_done = tasks_done_,
                         .tasks_started = tasks_started_,
                         .last_train_loss = last_train_loss_};
    if (p.committed_round != reported_committed_) {
      // The committed round's stored training loss (read once per round).
      reported_committed_ = p.committed_round;
      StatusOr<std::vector<storage::Round>> rounds = store_.ListRounds(runner_->id());
      if (rounds.ok()) {
        for (const storage::Round& r : *rounds) {
          if (r.round == p.committed_round && r.status == storage::RoundStatus::kCommitted)
            last_train_loss_ = r.train_loss;
        }
      }
      p.last_train_loss = last_train_loss_;
    }
    options_.on_progress(p);
  }

  const SimulationOptions& options_;
  VirtualSecureAggregation secure_;  // the workers' part in secure attempts, on the loop
  VirtualTasks tasks_;               // the worker's side of each task, on the trainer threads
  storage::MetadataStore& store_;
  storage::BlobStore& blobs_;
  fs::path work_dir_;
  SystemClock clock_;
  SimulationBlobUrls urls_;
  boost::asio::io_context io_;
  boost::asio::thread_pool pool_;
  boost::asio::thread_pool trainers_;
  coordinator::WriteQueue writes_;
  coordinator::JobRunner* runner_ = nullptr;
  bool launch_failed_ = false;
  std::map<int64_t, VirtualWorker> workers_;  // loop thread only
  int in_flight_ = 0;
  std::optional<VirtualSchedule> schedule_;  // TimeAsynchronousRounds
  std::map<int64_t, HeldReport> held_;       // finished in real time, waiting for their virtual turn
  bool releasing_ = false;
  std::map<std::pair<int, int>, double> measured_ends_;  // (round, attempt) -> virtual end
  int progress_round_ = 0;
  int tasks_started_ = 0;
  int tasks_done_ = 0;
  int reported_committed_ = -1;
  std::optional<double> last_train_loss_;
};

}  // namespace

StatusOr<SimulationResult> RunSimulation(const SimulationOptions& given, worker::TrainerLauncher& launcher) {
  PARSYN_RETURN_IF_ERROR(CheckOptions(given));
  // Absolute paths: the trainer reads its task file's paths from its own working directory.
  SimulationOptions options = given;
  options.out = fs::absolute(given.out);
  options.data = fs::absolute(given.data);
  options.model_dir = fs::absolute(given.model_dir);
  std::error_code ec;
  fs::create_directories(options.out, ec);
  if (ec) return InternalError("--out " + options.out.string() + ": " + ec.message());
  if (fs::exists(options.out / "parsyn.db")) {
    return AlreadyExistsError("--out " + options.out.string() + " already holds a simulation (parsyn.db)");
  }
  const fs::path work_dir = options.out / "work";
  StatusOr<Prepared> prepared = Prepare(options);
  if (!prepared.ok()) {
    // Nothing ran: leave no half-made simulation behind, so the same --out can be used once the input is fixed.
    for (const char* name : {"parsyn.db", "parsyn.db-wal", "parsyn.db-shm", "parsyn.db-journal", "blobs", "work"}) {
      fs::remove_all(options.out / name, ec);
    }
    return prepared.status();
  }
  Prepared& p = *prepared;
  storage::SqliteMetadataStore* store = p.store.get();
  storage::DirectoryBlobStore* blobs = p.blobs.get();
  const storage::TrainingJob& job = p.job;
  const std::vector<std::string>& warnings = p.warnings;
  const std::vector<int64_t>& worker_ids = p.worker_ids;
  const coordinator::JobSpec* spec = &p.spec;

  std::map<int64_t, double> step_seconds;  // --speeds: each virtual worker's, by id
  if (!options.speeds.empty()) {
    PARSYN_ASSIGN_OR_RETURN(std::vector<double> speeds,
                            ParseWorkerSpeeds(options.speeds, options.workers, SpeedSeed(options.job)));
    for (size_t i = 0; i < worker_ids.size() && i < speeds.size(); ++i) step_seconds[worker_ids[i]] = speeds[i];
  }
  const bool async_timed = !step_seconds.empty() && spec->distributed.async.enabled;
  std::map<std::pair<int, int>, double> measured_ends;  // asynchronous jobs with --speeds
  {
    SimulationHost host(options, launcher, *store, *blobs, work_dir, spec->config.seed);
    for (int64_t id : worker_ids) host.AddWorker(id);
    if (async_timed) host.TimeAsynchronousRounds(step_seconds, spec->distributed.steps_per_round);
    coordinator::JobRunner runner(host, job, *spec);
    host.set_runner(&runner);
    auto main = [&]() -> http::Awaitable<void> {
      Status launched = co_await runner.Launch();
      if (!launched.ok()) {
        PARSYN_LOG_ERROR("training job {}: {}", job.id, launched.ToString());
        host.set_launch_failed();
      }
      co_await host.OfferIdle();
      co_await host.TickLoop();
    };
    boost::asio::co_spawn(host.io(), main(), boost::asio::detached);
    if (spec->distributed.secure_aggregation.enabled)
      boost::asio::co_spawn(host.io(), host.SecureLoop(), boost::asio::detached);
    host.io().run();
    measured_ends = host.measured_ends();
  }

  SimulationResult result;
  result.warnings = warnings;
  PARSYN_ASSIGN_OR_RETURN(result.job, store->GetJob(job.id));
  PARSYN_ASSIGN_OR_RETURN(result.report,
                          ReadRoundReport(*store, job.id, options.workers,
                                          async_timed ? std::map<int64_t, double>{} : step_seconds, measured_ends));
  PARSYN_RETURN_IF_ERROR(WriteRoundReport(result.report, options.out));
  // The last committed global, for users (and scripts) that want the model without reading the store.
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Round> rounds, store->ListRounds(job.id));
  for (const storage::Round& r : rounds) {
    if (r.global_sha256 != result.report.final_global_sha256 || r.global_blob_key.empty()) continue;
    PARSYN_ASSIGN_OR_RETURN(fs::path global, blobs->LocalPath(r.global_blob_key));
    fs::copy_file(global, options.out / "global.safetensors", fs::copy_options::overwrite_existing, ec);
    if (ec) return InternalError("cannot write " + (options.out / "global.safetensors").string() + ": " + ec.message());
    break;
  }
  fs::remove_all(work_dir, ec);
  return result;
}

}  // namespace parsyn::simulation
