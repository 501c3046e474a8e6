// GET /readyz and GET /metrics on the service: the store probes and stored gauges, each shared by the callers of a
// short while (loop::SharedForAWhile), because both routes are open.
#include "coordinator/service.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <algorithm>
#include <map>

#include "base/log.h"
#include "coordinator/server_metrics.h"
#include "loop/loop_tools.h"
#include "storage/byte_source.h"

namespace parsyn::coordinator {

using nlohmann::json;

http::Awaitable<http::Response> Service::Readiness() {
  // Real calls, each cheap: a read of the metadata store, and a small blob written and deleted (a store that lists
  // or stats fine may still refuse writes, which every round needs). The answer names which store failed and its
  // error's kind only: the route is open, and the details (hosts, paths, SQL) stay in the log.
  auto probed = readiness_.Get(pool_, clock_, [this] {  // kCoAwaitTemporaries
    json problems = json::object();
    auto note = [&](std::string_view store, const Status& s) {
      if (s.ok()) return;
      PARSYN_LOG_WARN("readyz: the {} does not answer: {}", store, s.ToString());
      problems[std::string(store)] = std::string(StatusCodeSlug(s.code())) + "; see the coordinator's log";
    };
    note("metadata_store", store_->GetAdminKeyHash().status());
    constexpr std::string_view kProbeKey = "readyz/probe";
    storage::StringByteSource probe("ready");
    // AlreadyExists: another probe's blob, or one left by a probe that stopped halfway; the store answered.
    Status blob = blobs_->Put(kProbeKey, probe).status();
    if (blob.code() == StatusCode::kAlreadyExists) blob = Status::Ok();
    if (blob.ok()) {
      blob = blobs_->Delete(kProbeKey);
      if (blob.code() == StatusCode::kNotFound) blob = Status::Ok();
    }
    note("blob_store", blob);
    return problems;
  });
  const json problems = co_await std::move(probed);
  // A standby is ready too (it serves /healthz and /readyz, and takes over when the leader goes); its role says so.
  json body = {{"status", problems.empty() ? "ready" : "not_ready"}, {"role", leader() ? "leader" : "standby"}};
  if (!election_->leader_url().empty()) body["leader_url"] = election_->leader_url();
  if (!problems.empty()) body["not_ready"] = problems;
  co_return http::Response::Json(problems.empty() ? 200 : 503, body);
}

http::Awaitable<http::Response> Service::MetricsResponse() {
  ServerMetrics& m = Metrics();
  auto read = stored_gauges_.Get(pool_, clock_, [this]() -> StatusOr<StoredGauges> {  // kCoAwaitTemporaries
    StoredGauges gauges;
    PARSYN_ASSIGN_OR_RETURN(auto jobs, store_->ListJobs());
    for (const storage::TrainingJob& job : jobs) ++gauges.jobs[job.status];
    PARSYN_ASSIGN_OR_RETURN(auto workers, store_->ListWorkers());
    for (const storage::Worker& w : workers) gauges.worker_kinds[w.id] = w.kind;
    return gauges;
  });
  const StatusOr<StoredGauges> stored = co_await std::move(read);
  if (!stored.ok()) co_return http::Response::Error(stored.status().WithContext("reading the metadata store"));
  m.jobs.Clear();
  for (storage::JobStatus status :
       {storage::JobStatus::kQueued, storage::JobStatus::kRunning, storage::JobStatus::kSucceeded,
        storage::JobStatus::kFailed, storage::JobStatus::kStopped, storage::JobStatus::kCancelled}) {
    auto counted = stored->jobs.find(status);  // every status present, so rate() and alerts see zeros
    m.jobs.WithLabels({storage::ToString(status)}).Set(counted == stored->jobs.end() ? 0 : counted->second);
  }
  const std::map<int64_t, storage::WorkerKind>& kinds = stored->worker_kinds;
  m.workers_connected.Clear();
  for (storage::WorkerKind kind : {storage::WorkerKind::kOwn, storage::WorkerKind::kManaged}) {
    for (std::string_view status : {"online", "busy"})
      m.workers_connected.WithLabels({storage::ToString(kind), status});
  }
  std::vector<double> ages;
  const Clock::TimePoint now = clock_.Now();
  for (const auto& [worker_id, session] : sessions_->all()) {
    auto kind = kinds.find(worker_id);
    if (kind == kinds.end()) continue;
    const bool busy = session.current_job.has_value() || !session.queued.empty();
    m.workers_connected.WithLabels({storage::ToString(kind->second), busy ? "busy" : "online"}).Add(1);
    ages.push_back(std::chrono::duration<double>(now - session.last_seen).count());
  }
  std::sort(ages.begin(), ages.end());
  m.heartbeat_age_max.WithLabels({}).Set(ages.empty() ? 0 : ages.back());
  m.heartbeat_age_median.WithLabels({}).Set(ages.empty() ? 0 : ages[ages.size() / 2]);
  co_return http::Response::Text(200, RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace parsyn::coordinator
