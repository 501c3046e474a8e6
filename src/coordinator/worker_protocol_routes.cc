// The worker protocol (/api/v1/worker/...): hello, heartbeat, long-poll for the next task, progress, result,
// failure, goodbye. The worker's identity always comes from its token, never from the body.
#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <optional>
#include <utility>

#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/job_runner.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "loop/loop_tools.h"
#include "protocol/messages.h"

namespace parsyn::coordinator {

namespace {

// The wait_ms of a task poll: at most `max_wait`. InvalidArgument for anything but a non-negative integer.
StatusOr<std::chrono::milliseconds> PollWait(const Request& req, std::chrono::milliseconds max_wait) {
  auto it = req.query.find("wait_ms");
  if (it == req.query.end()) return max_wait;
  int64_t ms = -1;
  auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), ms);
  if (ec != std::errc() || end != it->second.data() + it->second.size() || ms < 0) {
    return InvalidArgumentError("wait_ms must be a non-negative integer");
  }
  return std::min(max_wait, std::chrono::milliseconds(ms));
}

Status NoSession(int64_t worker_id) {
  return FailedPreconditionError("worker " + std::to_string(worker_id) +
                                 " has no session with that id (expired or replaced): send hello again");
}

Status JobNotActive(int64_t job_id) {
  return NotFoundError("training job " + std::to_string(job_id) + " is not active");
}

}  // namespace

// Request bodies are read by src/protocol's readers (strict: unknown fields and wrong types rejected, every problem
// named).
ResultReport ToResultReport(protocol::Result result) {
  return ResultReport{.round = result.round,
                      .attempt = result.attempt,
                      .blob_key = std::move(result.blob_key),
                      .sha256 = std::move(result.sha256),
                      .sample_count = result.sample_count,
                      .train_loss = result.train_loss.value_or(0.0),
                      .validation_samples = result.validation_samples,
                      .validation_loss = result.validation_loss.value_or(0.0),
                      .metrics = std::move(result.metrics)};
}

// The protocol opens, refreshes and ends the worker sessions (WorkerSessions; Service::EndSession tells the jobs too).
class WorkerProtocolRoutes {
 public:
  using Session = WorkerSessions::Session;

  WorkerProtocolRoutes(const RouteContext& context, Service& service, WorkerSessions& sessions, FeedPublisher& feed)
      : context_(context), service_(service), sessions_(sessions), feed_(feed) {}

  // A new hello replaces an old session: its task (if any) is abandoned, as after a disconnect. The session keeps
  // what the hello says of the worker's own data (local_data): jobs over the workers' data take only such workers.
  Awaitable<Response> Hello(Request& req, int64_t worker_id) {
    StatusOr<protocol::Hello> hello = protocol::ParseHello(req.body);
    if (!hello.ok()) co_return Response::Error(hello.status());
    if (sessions_.Find(worker_id) != nullptr) co_await service_.EndSession(worker_id, "replaced by a new hello");
    StatusOr<std::string> session_id = NewSecret("pss_");
    if (!session_id.ok()) co_return Response::Error(session_id.status());
    sessions_.Open(worker_id, *session_id, *hello);
    co_await sessions_.SetWorkerStatus(worker_id, storage::WorkerStatus::kOnline, hello->device);
    // The registered name, so that the worker logs under it (a store error only leaves it unsaid).
    StatusOr<storage::Worker> registered =
        co_await loop::Offload(context_.pool, [&] { return context_.store.GetWorker(worker_id); });
    const ServiceOptions& options = service_.options();
    co_return Response::Json(200,
                             protocol::HelloAnswerToJson({.worker_id = worker_id,
                                                          .session_id = *session_id,
                                                          .heartbeat_interval_ms = options.heartbeat_interval.count(),
                                                          .heartbeat_timeout_ms = options.heartbeat_timeout.count(),
                                                          .max_poll_wait_ms = options.max_poll_wait.count(),
                                                          .worker_name = registered.ok() ? registered->name : ""}));
  }

  // Answers the tasks the worker must drop ("abandon").
  Awaitable<Response> Heartbeat(Request& req, int64_t worker_id) {
    StatusOr<Session*> found = SessionNamedInBody(req.body, worker_id);
    if (!found.ok()) co_return Response::Error(found.status());
    Session* s = *found;
    s->last_seen = context_.clock.Now();
    protocol::HeartbeatAnswer answer{.abandon = std::exchange(s->abandon, {})};
    for (auto job = s->jobs_served.begin(); job != s->jobs_served.end();) {
      const JobRunner* runner = service_.FindRunner(*job);
      if (runner != nullptr && !runner->finished()) {
        ++job;
        continue;
      }
      answer.ended_jobs.push_back(*job);
      job = s->jobs_served.erase(job);
    }
    const storage::WorkerStatus status =
        s->current_job || !s->queued.empty() ? storage::WorkerStatus::kBusy : storage::WorkerStatus::kOnline;
    // Liveness is judged from last_seen in memory, which reaches the store in the next presence flush (one commit
    // for all workers); busy/online is kept in the session (Session::status).
    if (s->status != status) co_await sessions_.SetWorkerStatus(worker_id, status);
    co_return Response::Json(200, protocol::HeartbeatAnswerToJson(answer));
  }

  // Long-poll: answers 200 with a task as soon as one is assigned, or 204 after wait_ms (at most max_poll_wait).
  Awaitable<Response> NextTask(Request& req, int64_t worker_id) {
    auto sid = req.query.find("session_id");
    Session* s = sessions_.Find(worker_id);
    if (sid == req.query.end() || s == nullptr || s->session_id != sid->second) {
      co_return Response::Error(NoSession(worker_id));
    }
    StatusOr<std::chrono::milliseconds> wait = PollWait(req, service_.options().max_poll_wait);
    if (!wait.ok()) co_return Response::Error(wait.status());
    const std::string session_id = s->session_id;
    std::shared_ptr<loop::Signal> wake = s->wake;
    // A worker that is killed leaves its poll open until the server writes to it; the poll's connection is watched
    // instead (one wait on its socket), so that its close ends the poll, and the session, at once.
    loop::Signal* client_left = req.connection != nullptr ? &req.connection->WatchForClientClose() : nullptr;
    auto client_gone = [&req] { return req.connection != nullptr && req.connection->client_gone(); };
    // Polling while holding an unreported task means the worker dropped it; the job's engine hears so below.
    sessions_.PollStarted(*s);
    if (s->queued.empty() && !client_gone()) co_await service_.OfferWorker(worker_id);
    const auto deadline = std::chrono::steady_clock::now() + *wait;
    while (true) {
      s = sessions_.Find(worker_id);
      if (s == nullptr || s->session_id != session_id || !s->queued.empty() || service_.shutting_down()) break;
      if (client_gone()) break;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      // Only the session's own signal and the poll's connection: BeginShutdown and EndSession notify the first.
      // Waiting on the shared shutdown_ too registered every open poll there, and each poll's end erased itself from
      // that list of all polls: O(N) per poll, O(N^2) when a round wakes N polls (16% of the coordinator's CPU in a
      // 2,000-worker round).
      if (client_left != nullptr) {
        std::array<loop::Signal*, 2> signals{wake.get(), client_left};
        if (co_await loop::WaitAny(signals, left) < 0) break;
      } else if (!co_await wake->Wait(left)) {
        break;
      }
    }
    s = sessions_.Find(worker_id);
    if (s == nullptr || s->session_id != session_id) co_return Response::Error(NoSession(worker_id));
    sessions_.PollEnded(*s);
    if (client_gone() && !service_.shutting_down()) {
      // The worker is gone: it may not stay idle and online until the heartbeat timeout, taking tasks it never
      // receives. Its session ends (a task queued for it meanwhile goes back to its job, which drops the worker from
      // the round) unless another poll of the session is still open (the worker polled again on a new connection).
      if (s->polls_in_flight == 0) co_await service_.EndSession(worker_id, "its task poll's connection was closed");
      co_return Response::NoContent();  // nobody reads it
    }
    std::optional<std::string> task = sessions_.HandOverQueuedTask(*s);
    if (!task) co_return Response::NoContent();
    co_return Response::Text(200, std::move(*task), "application/json");
  }

  // Stored as a metric point and shown live (the job's view and a worker_progress event). Only the task the worker
  // holds may report (409 otherwise, nothing written); a worker's reports in one job are stored at most once per
  // min_progress_interval (sooner ones get 429 and a Retry-After) and at most max_progress_points per job and worker
  // (later ones are still shown live, but store neither a point nor an event).
  Awaitable<Response> Progress(Request& req, int64_t worker_id) {
    StatusOr<protocol::Progress> body = protocol::ParseProgress(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    JobRunner* runner = service_.FindRunner(body->job_id);
    if (runner == nullptr || runner->finished()) {
      co_return Response::Error(
          FailedPreconditionError("training job " + std::to_string(body->job_id) + " is not running"));
    }
    if (Status held = HoldsTask(worker_id, *body); !held.ok()) co_return Response::Error(held);
    Touch(worker_id);
    const ServiceOptions& options = service_.options();
    const Clock::TimePoint now = context_.clock.Now();
    ProgressBudget& budget = progress_budgets_[worker_id];  // std::map: the reference outlives other insertions
    // The interval is between reports of one job: a worker's first report in a job is never refused for one it made
    // in the job before (a task shorter than the interval would then store no progress at all).
    if (budget.last_accepted && budget.last_accepted_job == body->job_id &&
        now - *budget.last_accepted < options.min_progress_interval) {
      const auto wait = options.min_progress_interval - (now - *budget.last_accepted);
      const int64_t retry_after_s = std::max<int64_t>(1, (wait.count() + 999) / 1000);
      Response busy = Response::Error(ResourceExhaustedError(
          "worker " + std::to_string(worker_id) + " reported progress less than " +
          std::to_string(options.min_progress_interval.count()) + " ms ago: report at most once per " +
          std::to_string(options.min_progress_interval.count()) + " ms"));
      busy.status = 429;
      busy.WithHeader("Retry-After", std::to_string(retry_after_s));
      co_return busy;
    }
    budget.last_accepted = now;  // before any co_await: a report arriving meanwhile is held to the interval too
    budget.last_accepted_job = body->job_id;
    if (budget.job_id != body->job_id) {
      // The first report for this job since the coordinator started (or since the worker's previous job): the count
      // comes from the store, so a restart does not reset the cap.
      const int64_t job_id = body->job_id;
      StatusOr<int64_t> stored_points =
          co_await loop::Offload(context_.pool, [&] { return context_.store.CountMetrics(job_id, worker_id); });
      if (!stored_points.ok()) co_return Response::Error(stored_points.status());
      budget.job_id = job_id;
      budget.stored_points = *stored_points;
    }
    const bool store_point = budget.stored_points < options.max_progress_points;
    if (store_point) {
      storage::MetricPoint point{.job_id = body->job_id,
                                 .round = static_cast<int32_t>(body->round),
                                 .worker_id = worker_id,
                                 .step = body->step,
                                 .loss = body->loss,
                                 .throughput = body->throughput,
                                 .utilization = body->utilization,
                                 .time_ms = context_.clock.UnixMillis()};
      budget.stored_points++;  // counted before the write completes: concurrent reports cannot overshoot the cap
      Status stored = co_await loop::Offload(context_.pool, [&] {
        return context_.store.AppendMetrics(std::span<const storage::MetricPoint>(&point, 1));
      });
      if (!stored.ok()) co_return Response::Error(stored);
    }
    json progress = {{"round", body->round},
                     {"step", body->step},
                     {"total_steps", body->total_steps ? json(*body->total_steps) : json()},
                     {"loss", body->loss ? json(*body->loss) : json()}};
    // The dashboard shows each worker's throughput and utilisation live from this event.
    if (body->throughput) progress["throughput"] = *body->throughput;
    if (!body->throughput_unit.empty()) progress["throughput_unit"] = body->throughput_unit;
    if (body->utilization) progress["utilization"] = *body->utilization;
    if (!body->utilization_device.empty()) progress["utilization_device"] = body->utilization_device;
    if (body->device_memory_used_bytes) progress["device_memory_used_bytes"] = *body->device_memory_used_bytes;
    if (body->device_memory_total_bytes) progress["device_memory_total_bytes"] = *body->device_memory_total_bytes;
    runner->RecordProgress(worker_id, progress);
    progress["worker_id"] = worker_id;
    if (!store_point) {
      // Past the cap nothing is stored, not even the event (1,000 workers reporting for 8 h were 58M rows): the
      // job's live view has it, and the dashboard's stream a sample.
      feed_.ForwardJobEvent(body->job_id, runner->project_id(), "worker_progress", progress);
      co_return Response::NoContent();
    }
    {
      auto event_appended = service_.AppendEvent(body->job_id, "worker_progress", progress);
      co_await std::move(event_appended);
    }
    co_return Response::NoContent();
  }

  // The worker's update (or evaluation) is uploaded; the job's runner checks it and answers the outcome.
  Awaitable<Response> Result(Request& req, int64_t worker_id) {
    StatusOr<protocol::Result> body = protocol::ParseResult(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    JobRunner* runner = service_.FindRunner(body->job_id);
    if (runner == nullptr) co_return Response::Error(JobNotActive(body->job_id));
    Touch(worker_id);
    auto result = runner->Result(worker_id, ToResultReport(std::move(*body)));  // kCoAwaitTemporaries (loop_tools.h)
    StatusOr<json> outcome = co_await std::move(result);
    if (!outcome.ok()) co_return Response::Error(outcome.status());
    co_return Response::Json(200, *outcome);
  }

  Awaitable<Response> Failure(Request& req, int64_t worker_id) {
    StatusOr<protocol::Failure> body = protocol::ParseFailure(req.body);
    if (!body.ok()) co_return Response::Error(body.status());
    JobRunner* runner = service_.FindRunner(body->job_id);
    if (runner == nullptr) co_return Response::Error(JobNotActive(body->job_id));
    Touch(worker_id);
    auto failed = runner->TaskFailed(worker_id, body->round, body->attempt,  // kCoAwaitTemporaries
                                     "the worker's task failed: " + std::move(body->reason));
    Status recorded = co_await std::move(failed);
    if (!recorded.ok()) co_return Response::Error(recorded);
    co_return Response::Json(200, {{"status", "recorded"}});
  }

  // A worker with no session left has nothing to end: a stopping worker cancels its poll first, and that closed
  // connection already ended its session. A goodbye naming another session than the worker's is refused (409): it
  // must not end a newer one.
  Awaitable<Response> Goodbye(Request& req, int64_t worker_id) {
    if (sessions_.Find(worker_id) == nullptr) {
      StatusOr<protocol::Heartbeat> body = protocol::ParseHeartbeat(req.body);
      co_return body.ok() ? Response::NoContent() : Response::Error(body.status());
    }
    StatusOr<Session*> found = SessionNamedInBody(req.body, worker_id);
    if (!found.ok()) co_return Response::Error(found.status());
    co_await service_.EndSession(worker_id, "goodbye");
    co_return Response::NoContent();
  }

 private:
  // The worker's session named by a {"session_id": ...} body (heartbeat, goodbye): InvalidArgument for another body,
  // FailedPrecondition when the worker has no session with that id (expired or replaced).
  StatusOr<Session*> SessionNamedInBody(std::string_view body, int64_t worker_id) {
    PARSYN_ASSIGN_OR_RETURN(protocol::Heartbeat heartbeat, protocol::ParseHeartbeat(body));
    const std::string& session_id = heartbeat.session_id;
    Session* s = sessions_.Find(worker_id);
    if (s == nullptr || s->session_id != session_id) return NoSession(worker_id);
    return s;
  }

  // OK when the worker holds the task the progress names: the job, round and attempt (when sent) of the task it was
  // last given and has not yet reported. FailedPrecondition otherwise.
  Status HoldsTask(int64_t worker_id, const protocol::Progress& progress) {
    const Session* s = sessions_.Find(worker_id);
    const bool holds = s != nullptr && s->current_job == progress.job_id && s->current_round == progress.round &&
                       (!progress.attempt || s->current_attempt == *progress.attempt);
    if (holds) return Status::Ok();
    return FailedPreconditionError("worker " + std::to_string(worker_id) + " has no task in job " +
                                   std::to_string(progress.job_id) + " round " + std::to_string(progress.round) +
                                   (progress.attempt ? " attempt " + std::to_string(*progress.attempt) : ""));
  }

  // A report shows the worker alive.
  void Touch(int64_t worker_id) {
    if (Session* s = sessions_.Find(worker_id)) s->last_seen = context_.clock.Now();
  }

  // Per worker: when its last progress was accepted, and how many points it has stored for its current job.
  struct ProgressBudget {
    std::optional<Clock::TimePoint> last_accepted;
    int64_t last_accepted_job = 0;  // the job of the report accepted at last_accepted
    int64_t job_id = 0;             // whose stored_points these are; 0: none yet (job ids start at 1)
    int64_t stored_points = 0;
  };

  const RouteContext context_;
  Service& service_;
  WorkerSessions& sessions_;
  FeedPublisher& feed_;
  std::map<int64_t, ProgressBudget> progress_budgets_;  // one per worker that reported; touched on the loop only
};

Status AddWorkerProtocolRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<WorkerProtocolRoutes>(context, service, service.sessions(), service.feed_publisher());
  using R = WorkerProtocolRoutes;
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/hello", Bind(h, &R::Hello)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/heartbeat", Bind(h, &R::Heartbeat)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kGet, "/api/v1/worker/tasks/next", Bind(h, &R::NextTask)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/progress", Bind(h, &R::Progress)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/result", Bind(h, &R::Result)));
  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/failure", Bind(h, &R::Failure)));
  return routes.Worker(Method::kPost, "/api/v1/worker/goodbye", Bind(h, &R::Goodbye));
}

}  // namespace parsyn::coordinator
