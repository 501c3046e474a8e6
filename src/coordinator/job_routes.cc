// REST API v1 for training jobs: create (spec validated by job_spec.h, ids checked against the store; the settings it
// ignores answered as `warnings` and kept as "warning" events), list, get (with live round and per-worker state, and
// the warnings), rounds, metrics, events (SSE with Last-Event-ID replay), stop, cancel, artifacts.
#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <charconv>
#include <limits>
#include <map>
#include <optional>

#include "base/log.h"
#include "base/secure_random.h"
#include "coordinator/api_json.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/registration.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "coordinator/sharding.h"
#include "loop/loop_tools.h"
#include "protocol/field_reader.h"
#include "protocol/model_manifest.h"
#include "protocol/trainer_events.h"
#include "storage/byte_source.h"
#include "storage/local_blob_copy.h"
#include "strategy/dp_fed_avg.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;
using nlohmann::json;

namespace {

// The privacy reports (RoundPrivacyJson) of a dp_fedavg job's committed rounds, by round: from the job's
// round_committed events, stored in the commit's own batch and read through the store's index by type (one query for
// every round, no blob read).
StatusOr<std::map<int, json>> RoundPrivacyFromEvents(storage::MetadataStore& store, int64_t job_id) {
  std::map<int, json> by_round;
  PARSYN_RETURN_IF_ERROR(
      storage::ForEachJobEventOfType(store, job_id, "round_committed", [&](const storage::JobEvent& e) {
        json data = json::parse(e.payload_json, nullptr, false);
        if (data.is_object() && data.contains("privacy") && data["privacy"].is_object() &&
            data.value("round", json()).is_number_integer()) {
          by_round[data["round"].get<int>()] = std::move(data["privacy"]);
        }
      }));
  return by_round;
}

// Each secure attempt's participation (its secure_aggregation event, SecureRound::Participation: who was a
// participant, advertised, shared, was summed and revealed), by (round, attempt); read through the store's index by
// type.
StatusOr<std::map<std::pair<int, int>, json>> SecureParticipationFromEvents(storage::MetadataStore& store,
                                                                            int64_t job_id) {
  std::map<std::pair<int, int>, json> by_attempt;
  PARSYN_RETURN_IF_ERROR(
      storage::ForEachJobEventOfType(store, job_id, "secure_aggregation", [&](const storage::JobEvent& e) {
        json data = json::parse(e.payload_json, nullptr, false);
        if (!data.is_object() || !data.value("round", json()).is_number_integer() ||
            !data.value("attempt", json()).is_number_integer()) {
          return;
        }
        const std::pair<int, int> attempt{data["round"].get<int>(), data["attempt"].get<int>()};
        for (const char* field : {"job_id", "time_ms", "round", "attempt"}) data.erase(field);
        by_attempt[attempt] = std::move(data);
      }));
  return by_attempt;
}

// A committed dp_fedavg round's privacy report read from the accounting state stored beside the round's global (durable
// before the round commits): for a round whose event lacks it. Null when it cannot be read.
json StoredRoundPrivacy(storage::BlobStore& blobs, const storage::Round& round,
                        const strategy::DpFedAvgOptions& options) {
  const std::string key =
      round.global_blob_key.substr(0, round.global_blob_key.rfind('/') + 1) + std::string(kServerStateFile);
  StatusOr<std::unique_ptr<storage::ByteSource>> source = blobs.Get(key);
  if (!source.ok()) return nullptr;
  StatusOr<std::string> bytes = storage::ReadAll(**source, size_t{1} << 20);
  if (!bytes.ok()) return nullptr;
  StatusOr<weights::WeightSet> state = weights::ParseSafetensors(std::as_bytes(std::span(*bytes)));
  if (!state.ok()) return nullptr;
  StatusOr<strategy::DpAccountingState> accounting = strategy::ReadDpFedAvgState(*state);
  if (!accounting.ok() || !accounting->last_round) return nullptr;
  return RoundPrivacyJson(*accounting->last_round, options);
}

// GET job's `shards`: each platform shard's sizes and label histogram (null when the data has no label to count).
json ShardsJson(const std::vector<storage::Shard>& shards) {
  json out = json::array();
  for (const storage::Shard& s : shards) {
    if (s.blob_key.empty()) continue;  // a slot of a job over the workers' own data: nothing was split
    json histogram =
        s.label_histogram_json.empty() ? json(nullptr) : json::parse(s.label_histogram_json, nullptr, false);
    if (histogram.is_discarded()) histogram = nullptr;
    out.push_back({{"shard", s.shard_index},
                   {"worker_id", s.worker_id ? json(*s.worker_id) : json(nullptr)},
                   {"train_samples", s.train_rows},
                   {"validation_samples", s.validation_rows},
                   {"label_histogram", std::move(histogram)}});
  }
  return out;
}

// The messages of the job's "warning" events, oldest first (read through the store's index by type: the job's other
// events, worker progress among them, are not read).
StatusOr<std::vector<std::string>> ListWarnings(storage::MetadataStore& store, int64_t job_id) {
  std::vector<std::string> warnings;
  PARSYN_RETURN_IF_ERROR(storage::ForEachJobEventOfType(store, job_id, "warning", [&](const storage::JobEvent& e) {
    json data = json::parse(e.payload_json, nullptr, false);
    if (data.is_object() && data.contains("message") && data["message"].is_string()) {
      warnings.push_back(data["message"].get<std::string>());
    }
  }));
  return warnings;
}

}  // namespace

namespace {

// The id a client resumes after (Last-Event-ID, else ?after=); nullopt when it gave neither.
StatusOr<std::optional<int64_t>> LastEventId(const Request& req) {
  std::string_view text = req.Header("last-event-id");
  if (text.empty()) {
    auto it = req.query.find("after");
    if (it == req.query.end()) return std::optional<int64_t>();
    text = it->second;
  }
  int64_t id = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size() || id < 0) {
    return InvalidArgumentError("Last-Event-ID must be a non-negative integer, got '" +
                                std::string(text.substr(0, 64)) + "'");
  }
  return std::optional<int64_t>(id);
}

// The metrics page size: asked with ?limit=, kMetricsDefaultLimit when absent, at most kMetricsMaxLimit.
constexpr int kMetricsDefaultLimit = 1000;
constexpr int kMetricsMaxLimit = 10'000;

// A job in a list: its view without the spec.
json JobSummaryJson(const storage::TrainingJob& job) {
  json view = JobJson(job);
  view.erase("spec");
  return view;
}

// The terminal job_status event that ends an event stream.
bool EndsStream(const storage::JobEvent& e, const json& data) {
  return e.type == "job_status" && data.contains("status") &&
         storage::ParseJobStatus(data["status"].get<std::string>()).ok() &&
         storage::IsTerminal(*storage::ParseJobStatus(data["status"].get<std::string>()));
}

class JobRoutes {
 public:
  JobRoutes(const RouteContext& context, Service& service) : context_(context), service_(service) {}

  // POST /api/v1/training-jobs: stores the job (queued) and answers; setup runs after the answer. Every 400 lists its
  // problems by field (error.errors), so the dashboard's form places them.
  Awaitable<Response> Create(Request& req, const Caller&) {
    StatusOr<json> body = protocol::ParseJsonText(req.body, "request body");
    if (!body.ok()) co_return ProblemsResponse({{"", body.status().message()}});
    std::vector<FieldProblem> problems;
    StatusOr<JobSpec> spec = ParseJobSpecJson(*body, problems);
    if (!spec.ok()) co_return problems.empty() ? Response::Error(spec.status()) : ProblemsResponse(problems);
    std::vector<std::string> warnings = JobSpecWarnings(*body, *spec);
    const int64_t now = context_.clock.UnixMillis();
    std::vector<std::string> reference_problems;
    StatusOr<storage::TrainingJob> created =
        co_await loop::Offload(context_.pool, [&]() -> StatusOr<storage::TrainingJob> {
          PARSYN_RETURN_IF_ERROR(
              CheckReferences(context_.store, req.scope_id, *spec, *body, warnings, reference_problems));
          if (!reference_problems.empty()) return InvalidArgumentError("answered with reference_problems");
          PARSYN_ASSIGN_OR_RETURN(std::string private_seed, SecureRandomHex(32));
          storage::TrainingJob job{.name = spec->name,
                                   .dataset_id = spec->dataset_id,
                                   .model_id = spec->model_id,
                                   .project_id = req.scope_id,
                                   .spec_json = JobSpecToJsonString(*spec),
                                   .created_at_ms = now,
                                   .private_seed = std::move(private_seed)};
          return context_.store.CreateJob(job);
        });
    if (!reference_problems.empty()) co_return ProblemsResponse(FieldProblems(reference_problems));
    if (!created.ok()) co_return Response::Error(created.status());
    // The dashboard's stream: the new job as GET /training-jobs/{id} shows it, then its queued status.
    json created_view = JobJson(*created);
    created_view["job_id"] = created->id;
    service_.feed_publisher().Publish("job_created", std::move(created_view), created->project_id);
    {
      auto event_appended = service_.AppendEvent(created->id, "job_status", {{"status", "queued"}});
      co_await std::move(event_appended);
    }
    // Kept as events so the job's view (and its event stream) shows them later; run-time warnings join them.
    for (const std::string& warning : warnings) {
      auto event_appended = service_.AppendEvent(created->id, "warning", {{"message", warning}});
      co_await std::move(event_appended);
    }
    // Setup (sharding, the initial global) runs after the answer; the job shows queued until it is running.
    boost::asio::co_spawn(service_.executor(), service_.LaunchJob(*created), boost::asio::detached);
    json view = JobJson(*created);
    view["warnings"] = warnings;
    co_return Created("/api/v1/training-jobs", created->id, view);
  }

  // GET /api/v1/training-jobs[?status=S][&limit=N][&cursor=C]: one page of the jobs, without their specs.
  Awaitable<Response> List(Request& req, const Caller&) {
    std::optional<storage::JobStatus> filter;
    if (auto it = req.query.find("status"); it != req.query.end()) {
      StatusOr<storage::JobStatus> s = storage::ParseJobStatus(it->second);
      if (!s.ok()) co_return Response::Error(s.status());
      filter = *s;
    }
    StatusOr<PageRequest> page = ParsePageRequest(req);
    if (!page.ok()) co_return Response::Error(page.status());
    auto list = co_await loop::Offload(context_.pool,
                                       [&] { return context_.store.ListJobs(filter, PageQuery(*page, req.scope_id)); });
    if (!list.ok()) co_return Response::Error(list.status());
    co_return Response::Json(200, PageJson("training_jobs", *list, *page, JobSummaryJson));
  }

  Awaitable<Response> Get(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    auto job = co_await loop::Offload(context_.pool, [&] { return context_.store.GetJob(*id); });
    if (!job.ok()) co_return Response::Error(job.status());
    auto warnings = co_await loop::Offload(context_.pool, [&] { return ListWarnings(context_.store, *id); });
    if (!warnings.ok()) co_return Response::Error(warnings.status());
    auto shards = co_await loop::Offload(context_.pool, [&] { return context_.store.ListShards(*id); });
    if (!shards.ok()) co_return Response::Error(shards.status());
    json view = JobJson(*job);
    view["warnings"] = *warnings;
    view["shards"] = ShardsJson(*shards);
    if (JobRunner* r = service_.FindRunner(*id); r != nullptr && !r->finished()) view["live"] = r->LiveView();
    co_return Response::Json(200, view);
  }

  Awaitable<Response> Rounds(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    auto rounds = co_await loop::Offload(context_.pool, [&]() -> StatusOr<json> {
      PARSYN_ASSIGN_OR_RETURN(storage::TrainingJob job, context_.store.GetJob(*id));
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Round> list, context_.store.ListRounds(*id));
      // dp_fedavg: each committed round's ε and report, from its round_committed event.
      std::optional<strategy::DpFedAvgOptions> dp;
      const StatusOr<JobSpec> spec = ParseJobSpec(job.spec_json);
      if (spec.ok() && spec->distributed.strategy == strategy::StrategyKind::kDpFedAvg) {
        const strategy::StrategyOptions& o = spec->distributed.strategy_options;
        dp = strategy::DpFedAvgOptions{
            .clip_norm = o.clip_norm, .noise_multiplier = o.noise_multiplier, .delta = o.delta};
        if (!strategy::ValidateDpFedAvgOptions(*dp).ok()) dp.reset();
      }
      // An update's plain size is its global's (same layout and dtypes): read from any committed global.
      std::optional<uint64_t> plain_update_bytes;
      for (const storage::Round& r : list) {
        if (r.status != storage::RoundStatus::kCommitted || r.global_blob_key.empty()) continue;
        if (StatusOr<storage::BlobInfo> info = context_.blobs.Head(r.global_blob_key); info.ok()) {
          plain_update_bytes = info->size_bytes;
        }
        break;
      }
      std::map<int, json> privacy;
      if (dp) {
        PARSYN_ASSIGN_OR_RETURN(privacy, RoundPrivacyFromEvents(context_.store, *id));
      }
      // Secure aggregation: each attempt's participation in its phases, from its secure_aggregation event.
      std::map<std::pair<int, int>, json> secure;
      if (spec.ok() && spec->distributed.secure_aggregation.enabled) {
        PARSYN_ASSIGN_OR_RETURN(secure, SecureParticipationFromEvents(context_.store, *id));
      }
      json items = json::array();
      for (const storage::Round& r : list) {
        PARSYN_ASSIGN_OR_RETURN(auto updates, context_.store.ListUpdates(*id, r.round, r.attempt));
        const bool committed = r.status == storage::RoundStatus::kCommitted && !r.global_blob_key.empty();
        json report = nullptr;
        if (dp && committed) {
          auto it = privacy.find(r.round);
          report = it != privacy.end() ? it->second : StoredRoundPrivacy(context_.blobs, r, *dp);
        }
        items.push_back(RoundJson(r, updates, report, plain_update_bytes));
        if (auto it = secure.find({r.round, r.attempt}); it != secure.end()) {
          items.back()["secure_aggregation"] = it->second;
        }
      }
      return items;
    });
    if (!rounds.ok()) co_return Response::Error(rounds.status());
    co_return Response::Json(200, {{"rounds", *rounds}});
  }

  // GET /api/v1/training-jobs/{id}/metrics?cursor=&limit=: one page of the job's progress points (those after the
  // cursor, in the order stored), grouped by worker, paged like every list (next_cursor). The older spelling stays:
  // ?after= a point id, and "next", the `after` of the following page (both null on the last page).
  // Read and built on the pool: a page can be large.
  Awaitable<Response> Metrics(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    StatusOr<PageRequest> paging = ParsePageRequest(req, kMetricsDefaultLimit, kMetricsMaxLimit);
    if (!paging.ok()) co_return Response::Error(paging.status());
    if (req.query.contains("after") && req.query.contains("cursor")) {
      co_return Response::Error(InvalidArgumentError("give cursor or after (its older spelling), not both"));
    }
    StatusOr<int64_t> after = IntQuery(req, "after", paging->after_id, 0, std::numeric_limits<int64_t>::max());
    if (!after.ok()) co_return Response::Error(after.status());
    auto page = co_await loop::Offload(context_.pool, [&]() -> StatusOr<json> {
      PARSYN_RETURN_IF_ERROR(context_.store.GetJob(*id).status());
      // One more than asked tells whether another page follows.
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::StoredMetricPoint> points,
                              context_.store.ListMetricsPage(*id, *after, static_cast<int>(paging->limit) + 1));
      json next = nullptr;
      if (points.size() > static_cast<size_t>(paging->limit)) {
        points.resize(static_cast<size_t>(paging->limit));
        next = points.back().id;
      }
      std::map<int64_t, json> by_worker;
      for (const storage::StoredMetricPoint& stored : points) {
        const storage::MetricPoint& p = stored.point;
        json& series = by_worker[p.worker_id];
        if (series.is_null()) series = json::array();
        series.push_back({{"id", stored.id},
                          {"round", p.round},
                          {"step", p.step},
                          {"loss", p.loss ? json(*p.loss) : json()},
                          {"throughput", p.throughput ? json(*p.throughput) : json()},
                          {"utilization", p.utilization ? json(*p.utilization) : json()},
                          {"time_ms", p.time_ms}});
      }
      json workers = json::array();
      for (auto& [worker, series] : by_worker)
        workers.push_back({{"worker_id", worker}, {"points", std::move(series)}});
      json next_cursor = next.is_null() ? json(nullptr) : json(CursorAfter(next.get<int64_t>()));
      return json{{"workers", std::move(workers)}, {"next_cursor", std::move(next_cursor)}, {"next", std::move(next)}};
    });
    if (!page.ok()) co_return Response::Error(page.status());
    co_return Response::Json(200, *page);
  }

  // GET /api/v1/training-jobs/{id}/events: every stored event after Last-Event-ID (or ?after=), then new ones as
  // they happen (SSE); the stream ends after the job's terminal status event. Without either, the job's history
  // comes without its worker_progress events (there may be millions: the metrics route has the curve), then every
  // new event.
  Awaitable<Response> Events(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    StatusOr<std::optional<int64_t>> after = LastEventId(req);
    if (!after.ok()) co_return Response::Error(after.status());
    auto job = co_await loop::Offload(context_.pool, [&]() -> StatusOr<int64_t> {
      PARSYN_RETURN_IF_ERROR(context_.store.GetJob(*id).status());
      return context_.store.LastJobEventId(*id);
    });
    if (!job.ok()) co_return Response::Error(job.status());
    // Replayed without progress up to the tail as it is now, unless the client asked where to resume.
    const int64_t start_after = after->value_or(0);
    const int64_t history_end = after->has_value() ? 0 : *job;
    co_return Response::Events([this, job_id = *id, start_after, history_end](http::EventStream& stream) {
      return StreamEvents(job_id, start_after, history_end, stream);
    });
  }

  Awaitable<Response> Stop(Request& req, const Caller&) { return Control(req, /*stop=*/true); }
  Awaitable<Response> Cancel(Request& req, const Caller&) { return Control(req, /*stop=*/false); }

  Awaitable<Response> Artifacts(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    auto list = co_await loop::Offload(context_.pool, [&]() -> StatusOr<std::vector<storage::JobArtifact>> {
      PARSYN_RETURN_IF_ERROR(context_.store.GetJob(*id).status());
      return context_.store.ListJobArtifacts(*id);
    });
    if (!list.ok()) co_return Response::Error(list.status());
    co_return Response::Json(200, {{"artifacts", JsonArray(*list, ArtifactJson)}});
  }

  // GET /api/v1/training-jobs/{id}/artifacts/{name...}: the artifact's bytes.
  Awaitable<Response> Artifact(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    const std::string name = req.params["name"];
    auto copy = co_await loop::Offload(context_.pool, [&]() -> StatusOr<storage::LocalBlobCopy> {
      PARSYN_RETURN_IF_ERROR(context_.store.GetJob(*id).status());
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::JobArtifact> list, context_.store.ListJobArtifacts(*id));
      for (const storage::JobArtifact& a : list) {
        // Names are looked up, never used as paths.
        if (a.name == name) return storage::LocalBlobCopy::Open(context_.blobs, a.blob_key, context_.spool_dir);
      }
      return NotFoundError("training job " + std::to_string(*id) + " has no artifact '" + name.substr(0, 200) + "'");
    });
    if (!copy.ok()) co_return Response::Error(copy.status());
    co_return DownloadResponse(std::move(*copy), name,
                               name.ends_with(".json") ? "application/json" : "application/octet-stream");
  }

 private:
  // Events after start_after; those up to history_end (0: none) without worker_progress.
  Awaitable<void> StreamEvents(int64_t job_id, int64_t start_after, int64_t history_end, http::EventStream& stream) {
    int64_t last = start_after;
    loop::Signal& signal = service_.EventSignal(job_id);
    while (stream.open()) {
      const bool in_history = last < history_end;
      const storage::JobEventFilter filter =
          in_history ? storage::JobEventFilter{.type = "worker_progress", .exclude_type = true}
                     : storage::JobEventFilter{};
      auto events = co_await loop::Offload(context_.pool,
                                           [&] { return context_.store.ListJobEvents(job_id, last, 1000, filter); });
      if (!events.ok()) {
        // The stream ends (its client reconnects with Last-Event-ID); the log says why it ended early.
        PARSYN_LOG_WARN("training job {}: its event stream ended after event {}: {}", job_id, last,
                        events.status().ToString());
        co_return;
      }
      if (in_history) {
        // The history ends at history_end: later events come unfiltered, from there on.
        std::erase_if(*events, [&](const storage::JobEvent& e) { return e.id > history_end; });
        if (events->empty()) {
          last = history_end;
          continue;
        }
      }
      bool ended = false;
      std::vector<http::EventStream::Frame> frames;  // the page in one write
      for (const storage::JobEvent& e : *events) {
        json data = json::parse(e.payload_json, nullptr, false);
        if (data.is_discarded()) data = json::object();
        data["job_id"] = e.job_id;
        data["time_ms"] = e.time_ms;
        frames.push_back({.event = e.type, .data = data.dump(), .id = std::to_string(e.id)});
        last = e.id;
        if (EndsStream(e, data)) ended = true;
      }
      if (!co_await stream.SendAll(frames)) co_return;
      if (ended) co_return;
      if (!events->empty()) continue;  // there may be more than one page
      if (!co_await stream.Wait(signal)) co_return;
    }
  }

  // Stop (finish with the latest committed global) or cancel a running job; answers the job with its live view.
  Awaitable<Response> Control(Request& req, bool stop) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "training job");
    if (!id.ok()) co_return Response::Error(id.status());
    auto job = co_await loop::Offload(context_.pool, [&] { return context_.store.GetJob(*id); });
    if (!job.ok()) co_return Response::Error(job.status());
    if (storage::IsTerminal(job->status)) {
      co_return Response::Error(FailedPreconditionError("training job " + std::to_string(*id) + " is already " +
                                                        std::string(storage::ToString(job->status))));
    }
    JobRunner* runner = service_.FindRunner(*id);
    Status s;
    if (runner == nullptr || runner->finished()) {
      s = FailedPreconditionError("training job " + std::to_string(*id) + " is not running yet");
    } else if (stop) {
      s = co_await runner->Stop();
    } else {
      s = co_await runner->Cancel();
    }
    if (!s.ok()) co_return Response::Error(s);
    auto after = co_await loop::Offload(context_.pool, [&] { return context_.store.GetJob(*id); });
    if (!after.ok()) co_return Response::Error(after.status());
    json view = JobJson(*after);
    if (!runner->finished()) view["live"] = runner->LiveView();
    co_return Response::Json(200, view);
  }

  const RouteContext context_;
  Service& service_;
};

}  // namespace

Status AddJobRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<JobRoutes>(context, service);
  using storage::ProjectRole;
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kPost, "/api/v1/training-jobs", Bind(h, &JobRoutes::Create), ProjectRole::kEditor));
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kGet, "/api/v1/training-jobs", Bind(h, &JobRoutes::List), ProjectRole::kViewer));
  const ObjectProject owner =
      OwnerById(context, "training job", [](storage::MetadataStore& s, int64_t id) { return s.GetJob(id); });
  const std::pair<std::string_view, http::Awaitable<Response> (JobRoutes::*)(Request&, const Caller&)> reads[] = {
      {"", &JobRoutes::Get},
      {"/rounds", &JobRoutes::Rounds},
      {"/metrics", &JobRoutes::Metrics},
      {"/events", &JobRoutes::Events},
      {"/artifacts", &JobRoutes::Artifacts},
      {"/artifacts/{name...}", &JobRoutes::Artifact}};
  for (const auto& [suffix, handler] : reads) {
    PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kGet, "/api/v1/training-jobs/{id}" + std::string(suffix),
                                                  Bind(h, handler), ProjectRole::kViewer, owner));
  }
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kPost, "/api/v1/training-jobs/{id}/stop",
                                                Bind(h, &JobRoutes::Stop), ProjectRole::kEditor, owner));
  return routes.OnProjectObject(Method::kPost, "/api/v1/training-jobs/{id}/cancel", Bind(h, &JobRoutes::Cancel),
                                ProjectRole::kEditor, owner);
}

}  // namespace parsyn::coordinator
