#include "worker/agent.h"

#include <cctype>
#include <condition_variable>
#include <fstream>
#include <random>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "weights/safetensors.h"
#include "weights/update_wire.h"
#include "worker/agent_internal.h"
#include "worker/global_downlink.h"
#include "worker/telemetry.h"
#include "worker/update_upload.h"

namespace parsyn::worker {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kVersion = "parsyn-worker 0.1.0";

// Capped exponential backoff with jitter: each wait is drawn from [b/2, b], b doubling up to the cap.
class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max)
      : initial_(initial), max_(max), next_(initial) {}
  void Reset() { next_ = initial_; }
  bool Wait(std::stop_token stop) {
    std::uniform_int_distribution<int64_t> pick(next_.count() / 2, next_.count());
    const std::chrono::milliseconds wait(pick(rng_));
    next_ = std::min(max_, next_ * 2);
    return SleepUnlessStopped(wait, stop);
  }

 private:
  std::chrono::milliseconds initial_, max_, next_;
  std::mt19937_64 rng_{std::random_device{}()};
};

bool IsPermanent(const Status& s) {
  return s.code() == StatusCode::kUnauthenticated || s.code() == StatusCode::kPermissionDenied;
}

// No bearer token: blob URLs are signed in their query, and the token must never reach a blob store (S3 also
// refuses a presigned request that carries an Authorization header). Relative URLs resolve against the coordinator.
http::ClientOptions BlobClientOptions(const AgentOptions& agent, const std::string& server_url) {
  http::ClientOptions options;
  options.base_url = server_url;
  options.max_attempts = 3;
  options.ca_file = agent.ca_file;
  options.client_cert_file = agent.client_cert_file;
  options.client_key_file = agent.client_key_file;
  return options;
}

}  // namespace

// Error feedback's residuals, one file per job, kept between this worker's tasks of the job (docs/compression.md,
// "In jobs"). Cleared when the worker starts: a restarted worker's residual starts from zero.
fs::path WorkerStateDir(const fs::path& cache_root, int64_t worker_id) {
  return cache_root / "state" / ("w" + std::to_string(worker_id));
}

// Counts the data lines of a text file (CSV: without its header line).
StatusOr<int64_t> CountRows(const fs::path& path, bool has_header) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read " + path.string());
  int64_t rows = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line != "\r") rows++;
  }
  return has_header && rows > 0 ? rows - 1 : rows;
}

std::vector<std::string> SplitServerUrls(std::string_view urls) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= urls.size()) {
    size_t end = urls.find(',', start);
    if (end == std::string_view::npos) end = urls.size();
    std::string url(urls.substr(start, end - start));
    while (!url.empty() && std::isspace(static_cast<unsigned char>(url.front()))) url.erase(0, 1);
    while (!url.empty() && (std::isspace(static_cast<unsigned char>(url.back())) || url.back() == '/')) url.pop_back();
    if (!url.empty()) out.push_back(std::move(url));
    start = end + 1;
  }
  return out;
}

Agent::Agent(AgentOptions options, TrainerLauncher& launcher)
    : options_(std::move(options)),
      supervisor_(launcher),
      urls_(SplitServerUrls(options_.server_url)),
      cache_(options_.cache_dir) {
  if (urls_.empty()) urls_.push_back(options_.server_url);
  MakeClients(0);
}

void Agent::MakeClients(size_t url_index) {
  url_index_ = url_index;
  client_ = std::make_unique<http::Client>(http::ClientOptions{.base_url = urls_[url_index],
                                                               .bearer_token = options_.token,
                                                               .max_attempts = 3,
                                                               .ca_file = options_.ca_file,
                                                               .client_cert_file = options_.client_cert_file,
                                                               .client_key_file = options_.client_key_file,
                                                               .unreachable_hint = "is `parsyn server` running?"});
  blob_client_ = std::make_unique<http::Client>(BlobClientOptions(options_, urls_[url_index]));
}

Agent::~Agent() = default;

Status Agent::Run(std::stop_token stop) {
  Backoff backoff(options_.backoff_initial, options_.backoff_max);
  while (!stop.stop_requested()) {
    StatusOr<Session> session = Hello(stop);
    if (!session.ok()) {
      if (IsPermanent(session.status())) {
        NoteTokenRefused(session.status());
        return session.status();
      }
      if (session.status().code() == StatusCode::kCancelled) break;
      PARSYN_LOG_WARN("worker {}: cannot reach the coordinator: {}", options_.name, session.status().message());
      backoff.Wait(stop);
      continue;
    }
    backoff.Reset();
    if (counters_.sessions++ == 0) {
      std::error_code ignored;  // a residual left by an earlier run of this worker: error feedback restarts from zero
      fs::remove_all(WorkerStateDir(cache_.root(), session->worker_id), ignored);
    }
    PARSYN_LOG_INFO("worker {}: online (session {}…)", options_.name, session->id.substr(0, 8));
    Status ended = RunSession(*session, stop);
    if (IsPermanent(ended)) return ended;
    if (token_refused_) return PermissionDeniedError("the coordinator refused this worker's token (revoked?)");
    if (ended.ok()) continue;  // stop requested, or the session ended: hello again at once
    PARSYN_LOG_WARN("worker {}: session interrupted: {}", options_.name, ended.message());
    backoff.Wait(stop);
  }
  PARSYN_LOG_INFO("worker {}: stopped ({} tasks done, {} failed)", options_.name, counters_.tasks_completed.load(),
                  counters_.tasks_failed.load());
  return Status::Ok();
}

StatusOr<Agent::Session> Agent::Hello(std::stop_token stop) {
  if (urls_.size() == 1) return HelloTo(0, stop);
  // The coordinator of the last session first (it was the leader), then the others in turn.
  Status last = Status::Ok();
  for (size_t i = 0; i < urls_.size(); ++i) {
    const size_t index = (url_index_ + i) % urls_.size();
    StatusOr<Session> session = HelloTo(index, stop);
    if (session.ok() || IsPermanent(session.status()) || session.status().code() == StatusCode::kCancelled) {
      return session;
    }
    PARSYN_LOG_DEBUG("worker {}: {}: {}", options_.name, urls_[index], session.status().message());
    last = session.status();
  }
  // Failover in progress, or no coordinator up: the caller backs off and tries them all again.
  return last.WithContext("no coordinator of " + options_.server_url + " accepted the hello");
}

StatusOr<Agent::Session> Agent::HelloTo(size_t url_index, std::stop_token stop) {
  MakeClients(url_index);
  http::CallOptions call;
  call.stop = stop;
  // Hello is idempotent (a repeated one replaces the session it made); with several coordinators a standby's 503 is
  // not retried here: the next URL is tried instead.
  call.retry = urls_.size() == 1;
  protocol::Hello hello{.device = options_.device, .version = kVersion};
  const uint64_t memory =
      options_.device_memory_bytes > 0 ? options_.device_memory_bytes : DeviceMemoryBytes(options_.device);
  if (memory > 0) hello.device_memory_bytes = static_cast<int64_t>(memory);
  if (options_.lora_rank > 0) hello.lora_rank = options_.lora_rank;
  for (const DescribedTrainer& t : options_.trainers) {
    hello.trainers.push_back({.name = t.command.name, .description = t.description});
  }
  if (!options_.local_data.empty()) {
    // Only the file's shape is announced (jobs over the workers' own data take only workers that have some).
    const bool csv = options_.local_data.extension() == ".csv";
    PARSYN_ASSIGN_OR_RETURN(int64_t rows, CountRows(options_.local_data, csv));
    if (rows < 1) return FailedPreconditionError("--data " + options_.local_data.string() + " has no data rows");
    hello.local_data = protocol::LocalData{.format = csv ? "csv" : "jsonl", .rows = rows};
  }
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res,
                          client_->PostJson("/api/v1/worker/hello", protocol::HelloToJson(hello), call));
  PARSYN_ASSIGN_OR_RETURN(json body, res.Json());
  StatusOr<protocol::HelloAnswer> answer = protocol::ParseHelloAnswer(body);
  if (!answer.ok()) return InternalError("the coordinator's hello answer is malformed: " + answer.status().message());
  // Only here, between sessions, when no other thread of this agent reads options_.name.
  if (options_.name_from_coordinator && !answer->worker_name.empty()) options_.name = answer->worker_name;
  Session s;
  s.id = answer->session_id;
  s.worker_id = answer->worker_id;
  s.heartbeat_interval = std::chrono::milliseconds(answer->heartbeat_interval_ms);
  s.max_poll_wait = std::chrono::milliseconds(answer->max_poll_wait_ms);
  session_lost_ = false;
  return s;
}

Status Agent::RunSession(const Session& session, std::stop_token stop) {
  std::jthread heartbeats([this, &session](std::stop_token hb_stop) { HeartbeatLoop(session, hb_stop); });
  Status ended = Status::Ok();
  Backoff backoff(options_.backoff_initial, options_.backoff_max);
  while (!stop.stop_requested()) {
    if (session_lost_ || token_refused_) break;  // a heartbeat learned the session is gone or the token revoked
    http::CallOptions call;
    call.stop = stop;
    call.retry = false;
    call.timeout = session.max_poll_wait + std::chrono::seconds(15);
    {
      std::lock_guard lock(poll_mutex_);  // waits out a heartbeat in flight: never one beside an open poll
      poll_open_ = true;                  // the heartbeat thread stays quiet: the open poll is this worker's presence
    }
    StatusOr<http::ClientResponse> res = client_->Get("/api/v1/worker/tasks/next?session_id=" + session.id +
                                                          "&wait_ms=" + std::to_string(session.max_poll_wait.count()),
                                                      call);
    poll_open_ = false;
    if (!res.ok()) {
      if (res.status().code() == StatusCode::kCancelled) break;
      if (res.status().code() == StatusCode::kFailedPrecondition) {
        PARSYN_LOG_INFO("worker {}: the coordinator ended this session; saying hello again", options_.name);
        break;
      }
      if (IsPermanent(res.status())) {
        NoteTokenRefused(res.status());
        ended = res.status();
        break;
      }
      // With several coordinators, one that stops answering may have lost the leadership: find the leader again.
      if (urls_.size() > 1) {
        PARSYN_LOG_WARN("worker {}: polling {} failed ({}); looking for the leader", options_.name, urls_[url_index_],
                        res.status().message());
        ended = res.status();
        break;
      }
      // Unreachable for a moment: keep the session (its heartbeat timeout is the coordinator's to apply).
      PARSYN_LOG_WARN("worker {}: polling for tasks failed: {}", options_.name, res.status().message());
      if (!backoff.Wait(stop)) break;
      continue;
    }
    backoff.Reset();
    if (res->status == 204) continue;
    StatusOr<json> task = res->Json();
    if (!task.ok()) {
      PARSYN_LOG_ERROR("worker {}: the coordinator sent a task that is not JSON: {}", options_.name,
                       task.status().message());
      continue;  // the next poll tells the coordinator this task was dropped
    }
    RunTask(session, *task, stop);
  }
  heartbeats.request_stop();
  heartbeats.join();
  if (stop.stop_requested() && !session_lost_ && !token_refused_) {
    http::CallOptions call;
    call.timeout = std::chrono::seconds(3);
    call.retry = false;
    Status bye =
        client_->PostJson("/api/v1/worker/goodbye", protocol::HeartbeatToJson({.session_id = session.id}), call)
            .status();
    if (!bye.ok()) PARSYN_LOG_WARN("worker {}: goodbye failed: {}", options_.name, bye.message());
  }
  return ended;
}

void Agent::HeartbeatLoop(const Session& session, std::stop_token stop) {
  while (SleepUnlessStopped(session.heartbeat_interval, stop)) {
    // One connection per idle worker: while a long-poll is open the coordinator counts the worker present (the poll
    // refreshes its session), so a heartbeat then would only hold a second connection open. Heartbeats go while the
    // poll connection is free: during a task (training, uploading) or between polls (backing off).
    std::unique_lock lock(poll_mutex_);
    if (poll_open_) continue;
    counters_.heartbeats++;
    Status s = Heartbeat(session);
    lock.unlock();
    if (s.code() == StatusCode::kFailedPrecondition) {
      PARSYN_LOG_WARN("worker {}: heartbeat refused ({}); the current task is dropped", options_.name, s.message());
      return;
    }
    if (token_refused_) return;
    if (!s.ok()) PARSYN_LOG_DEBUG("worker {}: heartbeat failed: {}", options_.name, s.message());
  }
}

Status Agent::Heartbeat(const Session& session) {
  http::CallOptions call;
  call.timeout = std::chrono::seconds(10);
  call.retry = false;
  StatusOr<http::ClientResponse> res =
      client_->PostJson("/api/v1/worker/heartbeat", protocol::HeartbeatToJson({.session_id = session.id}), call);
  if (!res.ok()) {
    if (res.status().code() == StatusCode::kFailedPrecondition) {
      session_lost_ = true;
      AbandonCurrent(0, 0, 0, "the coordinator no longer knows this session");
    }
    NoteTokenRefused(res.status());
    return res.status();
  }
  StatusOr<json> body = res->Json();
  if (!body.ok()) return body.status();
  PARSYN_ASSIGN_OR_RETURN(protocol::HeartbeatAnswer answer, protocol::ParseHeartbeatAnswer(*body));
  for (const protocol::AbandonedTask& a : answer.abandon) {
    AbandonCurrent(a.job_id, a.round, a.attempt, "the coordinator dropped the task (straggler or job ended)");
  }
  for (int64_t job_id : answer.ended_jobs) ForgetJob(WorkerStateDir(cache_.root(), session.worker_id), job_id);
  return Status::Ok();
}

void Agent::AbandonCurrent(int64_t job_id, int round, int attempt, const std::string& why) {
  std::lock_guard lock(mutex_);
  if (!current_) return;
  if (job_id != 0 && (current_->job_id != job_id || current_->round != round || current_->attempt != attempt)) return;
  if (!current_->abandoned) {
    current_->abandoned = true;
    current_->why = why;
  }
  current_->stop.request_stop();  // the supervisor stops the trainer
}

void Agent::NoteTokenRefused(const Status& status) {
  if (!IsPermanent(status)) return;
  if (!token_refused_.exchange(true)) {
    PARSYN_LOG_ERROR("worker {}: the coordinator refused this worker's token (revoked?): stopping ({})", options_.name,
                     status.message());
  }
  // Training on is wasted work whose update could not be delivered: the trainer stops now.
  AbandonCurrent(0, 0, 0, "the coordinator refused this worker's token (revoked?)");
}

bool Agent::CurrentAbandoned(std::string* why) {
  std::lock_guard lock(mutex_);
  if (current_ && current_->abandoned && why != nullptr) *why = current_->why;
  return current_ && current_->abandoned;
}

}  // namespace parsyn::worker
