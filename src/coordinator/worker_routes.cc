// The worker protocol (/api/v1/worker/...): hello, heartbeat, long-poll for the next task, progress, result,
// goodbye. The worker's identity always comes from its token, never from the body.
#include <array>
#include <charconv>
#include <cmath>

#include "base/log.h"
#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/job_runner.h"
#include "coordinator/loop_tools.h"
#include "coordinator/service_routes.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;
using nlohmann::json;

namespace {

Status NoSession(int64_t worker_id) {
  return FailedPreconditionError("worker " + std::to_string(worker_id) +
                                 " has no session with that id (expired or replaced): send hello again");
}

}  // namespace

StatusOr<Service::Session*> Service::SessionNamedInBody(const std::string& body, int64_t worker_id) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Parse(body, {"session_id"}));
  std::optional<std::string> session_id = fields.String("session_id", true);
  PARSYN_RETURN_IF_ERROR(fields.status());
  Session* s = FindSession(worker_id);
  if (s == nullptr || s->session_id != *session_id) return NoSession(worker_id);
  return s;
}

Status Service::AddWorkerRoutes(Routes& routes) {
  Service* self = this;

  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kPost, "/api/v1/worker/hello", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        StatusOr<JsonFields> fields = JsonFields::Parse(req.body.empty() ? "{}" : req.body, {"device", "version"});
        if (!fields.ok()) co_return Response::Error(fields.status());
        std::string device = fields->String("device", false).value_or("");
        (void)fields->String("version", false);
        if (!fields->status().ok()) co_return Response::Error(fields->status());
        // A new hello replaces an old session: its task (if any) is abandoned, as after a disconnect.
        if (self->FindSession(worker_id) != nullptr) co_await self->EndSession(worker_id, "replaced by a new hello");
        StatusOr<std::string> session_id = NewSecret("pss_");
        if (!session_id.ok()) co_return Response::Error(session_id.status());
        Session& s = self->sessions_[worker_id];
        s.worker_id = worker_id;
        s.session_id = *session_id;
        s.last_seen = self->clock().Now();
        s.wake = std::make_shared<http::Signal>(self->executor());
        co_await self->SetWorkerStatus(worker_id, storage::WorkerStatus::kOnline, device);
        co_return Response::Json(200, {{"worker_id", worker_id},
                                       {"session_id", *session_id},
                                       {"heartbeat_interval_ms", self->options_.heartbeat_interval.count()},
                                       {"heartbeat_timeout_ms", self->options_.heartbeat_timeout.count()},
                                       {"max_poll_wait_ms", self->options_.max_poll_wait.count()}});
      }));

  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kPost, "/api/v1/worker/heartbeat", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        StatusOr<Session*> found = self->SessionNamedInBody(req.body, worker_id);
        if (!found.ok()) co_return Response::Error(found.status());
        Session* s = *found;
        s->last_seen = self->clock().Now();
        json abandon = std::move(s->abandon);
        s->abandon.clear();
        const storage::WorkerStatus status =
            s->current_job || !s->queued.empty() ? storage::WorkerStatus::kBusy : storage::WorkerStatus::kOnline;
        // Liveness is judged from last_seen in memory; the store gets status changes and a coarse heartbeat time.
        if (s->stored_status != status || s->last_seen - s->status_stored_at >= kHeartbeatStoreInterval) {
          co_await self->SetWorkerStatus(worker_id, status);
        }
        co_return Response::Json(200, {{"abandon", abandon.is_null() ? json::array() : abandon}});
      }));

  // Long-poll: answers 200 with a task as soon as one is assigned, or 204 after wait_ms (at most max_poll_wait).
  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kGet, "/api/v1/worker/tasks/next", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        auto sid = req.query.find("session_id");
        Session* s = self->FindSession(worker_id);
        if (sid == req.query.end() || s == nullptr || s->session_id != sid->second) {
          co_return Response::Error(NoSession(worker_id));
        }
        std::chrono::milliseconds wait = self->options_.max_poll_wait;
        if (auto it = req.query.find("wait_ms"); it != req.query.end()) {
          int64_t ms = -1;
          auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), ms);
          if (ec != std::errc() || end != it->second.data() + it->second.size() || ms < 0) {
            co_return Response::Error(InvalidArgumentError("wait_ms must be a non-negative integer"));
          }
          wait = std::min(wait, std::chrono::milliseconds(ms));
        }
        const std::string session_id = s->session_id;
        std::shared_ptr<http::Signal> wake = s->wake;
        s->last_seen = self->clock().Now();
        // Polling while holding an unreported task means the worker dropped it; the job's engine hears so below.
        s->current_job.reset();
        s->current_task = json();
        s->polls_in_flight++;
        if (s->queued.empty()) co_await self->OfferWorker(worker_id);
        const auto deadline = std::chrono::steady_clock::now() + wait;
        while (true) {
          s = self->FindSession(worker_id);
          if (s == nullptr || s->session_id != session_id || !s->queued.empty() || self->shutting_down_) break;
          auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          if (left.count() <= 0) break;
          std::array<http::Signal*, 2> signals{wake.get(), &self->shutdown_};
          if (co_await http::WaitAny(signals, left) < 0) break;
        }
        s = self->FindSession(worker_id);
        if (s == nullptr || s->session_id != session_id) co_return Response::Error(NoSession(worker_id));
        s->polls_in_flight--;
        s->last_seen = self->clock().Now();
        if (s->queued.empty()) co_return Response::NoContent();
        Session::QueuedTask task = std::move(s->queued.front());
        s->queued.pop_front();
        s->current_job = task.job_id;
        s->current_task = task.task;
        co_return Response::Json(200, task.task);
      }));

  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kPost, "/api/v1/worker/progress", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"session_id", "job_id", "round", "attempt", "step",
                                                                   "total_steps", "loss", "throughput", "utilization"});
        if (!fields.ok()) co_return Response::Error(fields.status());
        (void)fields->String("session_id", false);
        std::optional<int64_t> job_id = fields->Int("job_id", true, 1, INT64_MAX);
        std::optional<int64_t> round = fields->Int("round", true, 1, 1'000'000);
        (void)fields->Int("attempt", false, 1, 1'000'000);
        std::optional<int64_t> step = fields->Int("step", true, 0, INT64_MAX);
        std::optional<int64_t> total_steps = fields->Int("total_steps", false, 0, INT64_MAX);
        std::optional<double> loss = fields->Number("loss", false);
        std::optional<double> throughput = fields->Number("throughput", false);
        std::optional<double> utilization = fields->Number("utilization", false);
        if (utilization && (*utilization < 0 || *utilization > 1)) fields->AddProblem("'utilization' must be in 0..1");
        if (!fields->status().ok()) co_return Response::Error(fields->status());
        JobRunner* runner = self->FindRunner(*job_id);
        if (runner == nullptr || runner->finished()) {
          co_return Response::Error(
              FailedPreconditionError("training job " + std::to_string(*job_id) + " is not running"));
        }
        if (Session* s = self->FindSession(worker_id)) s->last_seen = self->clock().Now();
        storage::MetricPoint point{.job_id = *job_id,
                                   .round = static_cast<int32_t>(*round),
                                   .worker_id = worker_id,
                                   .step = *step,
                                   .loss = loss,
                                   .throughput = throughput,
                                   .utilization = utilization,
                                   .time_ms = self->clock().UnixMillis()};
        Status stored = co_await Offload(self->pool(), [&] {
          return self->store().AppendMetrics(std::span<const storage::MetricPoint>(&point, 1));
        });
        if (!stored.ok()) co_return Response::Error(stored);
        json progress = {{"round", *round},
                         {"step", *step},
                         {"total_steps", total_steps ? json(*total_steps) : json()},
                         {"loss", loss ? json(*loss) : json()}};
        // The dashboard shows each worker's throughput and utilisation live from this event.
        if (throughput) progress["throughput"] = *throughput;
        if (utilization) progress["utilization"] = *utilization;
        runner->RecordProgress(worker_id, progress);
        progress["worker_id"] = worker_id;
        {
          auto event_appended = self->AppendEvent(*job_id, "worker_progress", progress);
          co_await std::move(event_appended);
        }
        co_return Response::NoContent();
      }));

  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kPost, "/api/v1/worker/result", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        StatusOr<JsonFields> fields = JsonFields::Parse(
            req.body, {"session_id", "job_id", "round", "attempt", "blob_key", "sha256", "sample_count", "train_loss",
                       "validation_loss", "validation_samples", "metrics"});
        if (!fields.ok()) co_return Response::Error(fields.status());
        (void)fields->String("session_id", false);
        std::optional<int64_t> job_id = fields->Int("job_id", true, 1, INT64_MAX);
        ResultReport report;
        report.round = static_cast<int>(fields->Int("round", true, 1, 1'000'000).value_or(0));
        report.attempt = static_cast<int>(fields->Int("attempt", true, 1, 1'000'000).value_or(0));
        report.blob_key = fields->String("blob_key", false, 512).value_or("");
        report.sha256 = fields->String("sha256", false, 64).value_or("");
        report.sample_count = fields->Int("sample_count", false, 0, INT64_MAX).value_or(0);
        report.train_loss = fields->Number("train_loss", false).value_or(0.0);
        report.validation_loss = fields->Number("validation_loss", false).value_or(0.0);
        report.validation_samples = fields->Int("validation_samples", false, 0, INT64_MAX).value_or(0);
        report.metrics = fields->Object("metrics", false).value_or(json::object());
        if (!fields->status().ok()) co_return Response::Error(fields->status());
        JobRunner* runner = self->FindRunner(*job_id);
        if (runner == nullptr) {
          co_return Response::Error(NotFoundError("training job " + std::to_string(*job_id) + " is not active"));
        }
        if (Session* s = self->FindSession(worker_id)) s->last_seen = self->clock().Now();
        auto result = runner->Result(worker_id, std::move(report));  // kCoAwaitTemporaries (loop_tools.h)
        StatusOr<json> outcome = co_await std::move(result);
        if (!outcome.ok()) co_return Response::Error(outcome.status());
        co_return Response::Json(200, *outcome);
      }));

  PARSYN_RETURN_IF_ERROR(routes.Worker(
      Method::kPost, "/api/v1/worker/failure", [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
        StatusOr<JsonFields> fields =
            JsonFields::Parse(req.body, {"session_id", "job_id", "round", "attempt", "reason"});
        if (!fields.ok()) co_return Response::Error(fields.status());
        (void)fields->String("session_id", false);
        std::optional<int64_t> job_id = fields->Int("job_id", true, 1, INT64_MAX);
        const int round = static_cast<int>(fields->Int("round", true, 1, 1'000'000).value_or(0));
        const int attempt = static_cast<int>(fields->Int("attempt", true, 1, 1'000'000).value_or(0));
        std::string reason = fields->String("reason", true, 2000).value_or("");
        if (!fields->status().ok()) co_return Response::Error(fields->status());
        JobRunner* runner = self->FindRunner(*job_id);
        if (runner == nullptr) {
          co_return Response::Error(NotFoundError("training job " + std::to_string(*job_id) + " is not active"));
        }
        if (Session* s = self->FindSession(worker_id)) s->last_seen = self->clock().Now();
        auto failed = runner->TaskFailed(worker_id, round, attempt,  // kCoAwaitTemporaries
                                         "the worker's task failed: " + std::move(reason));
        Status recorded = co_await std::move(failed);
        if (!recorded.ok()) co_return Response::Error(recorded);
        co_return Response::Json(200, {{"status", "recorded"}});
      }));

  PARSYN_RETURN_IF_ERROR(routes.Worker(Method::kPost, "/api/v1/worker/goodbye",
                                       [self](Request& req, int64_t worker_id) -> Awaitable<Response> {
                                         StatusOr<Session*> found = self->SessionNamedInBody(req.body, worker_id);
                                         if (!found.ok()) co_return Response::Error(found.status());
                                         Session* s = *found;
                                         co_await self->EndSession(worker_id, "goodbye");
                                         co_return Response::NoContent();
                                       }));
  return Status::Ok();
}

}  // namespace parsyn::coordinator
