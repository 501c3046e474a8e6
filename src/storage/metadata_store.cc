#include "storage/metadata_store.h"

#include <array>
#include <utility>

#include "storage/postgres_store.h"
#include "storage/sqlite_store.h"

namespace parsyn::storage {

std::string BatchWriteName(size_t index, size_t count) {
  return "write " + std::to_string(index + 1) + " of " + std::to_string(count) + " in a batch";
}
namespace {

template <typename E, size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

constexpr Names<DatasetFormat, 2> kDatasetFormats{{{DatasetFormat::kJsonl, "jsonl"}, {DatasetFormat::kCsv, "csv"}}};
constexpr Names<DatasetKind, 3> kDatasetKinds{{{DatasetKind::kText, "text"},
                                               {DatasetKind::kPromptCompletion, "prompt_completion"},
                                               {DatasetKind::kTabular, "tabular"}}};
constexpr Names<WorkerKind, 2> kWorkerKinds{{{WorkerKind::kOwn, "own"}, {WorkerKind::kManaged, "managed"}}};
constexpr Names<WorkerStatus, 3> kWorkerStatuses{
    {{WorkerStatus::kOffline, "offline"}, {WorkerStatus::kOnline, "online"}, {WorkerStatus::kBusy, "busy"}}};
constexpr Names<JobStatus, 6> kJobStatuses{{{JobStatus::kQueued, "queued"},
                                            {JobStatus::kRunning, "running"},
                                            {JobStatus::kSucceeded, "succeeded"},
                                            {JobStatus::kFailed, "failed"},
                                            {JobStatus::kStopped, "stopped"},
                                            {JobStatus::kCancelled, "cancelled"}}};
constexpr Names<RoundStatus, 3> kRoundStatuses{
    {{RoundStatus::kRunning, "running"}, {RoundStatus::kCommitted, "committed"}, {RoundStatus::kFailed, "failed"}}};
constexpr Names<UpdateStatus, 2> kUpdateStatuses{
    {{UpdateStatus::kAccepted, "accepted"}, {UpdateStatus::kRejected, "rejected"}}};
constexpr Names<ProjectRole, 3> kProjectRoles{
    {{ProjectRole::kViewer, "viewer"}, {ProjectRole::kEditor, "editor"}, {ProjectRole::kOwner, "owner"}}};

template <typename E, size_t N>
std::string_view NameOf(const Names<E, N>& names, E value) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "unknown";
}

template <typename E, size_t N>
StatusOr<E> Parse(const Names<E, N>& names, std::string_view what, std::string_view s) {
  std::string accepted;
  for (const auto& [v, name] : names) {
    if (name == s) return v;
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  }
  return InvalidArgumentError("unknown " + std::string(what) + " '" + std::string(s) + "'; expected one of " +
                              accepted);
}

}  // namespace

std::string_view ToString(DatasetFormat v) { return NameOf(kDatasetFormats, v); }
std::string_view ToString(DatasetKind v) { return NameOf(kDatasetKinds, v); }
std::string_view ToString(WorkerKind v) { return NameOf(kWorkerKinds, v); }
std::string_view ToString(WorkerStatus v) { return NameOf(kWorkerStatuses, v); }
std::string_view ToString(JobStatus v) { return NameOf(kJobStatuses, v); }
std::string_view ToString(RoundStatus v) { return NameOf(kRoundStatuses, v); }
std::string_view ToString(UpdateStatus v) { return NameOf(kUpdateStatuses, v); }
std::string_view ToString(ProjectRole v) { return NameOf(kProjectRoles, v); }

StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view s) { return Parse(kDatasetFormats, "dataset format", s); }
StatusOr<DatasetKind> ParseDatasetKind(std::string_view s) { return Parse(kDatasetKinds, "dataset kind", s); }
StatusOr<WorkerKind> ParseWorkerKind(std::string_view s) { return Parse(kWorkerKinds, "worker kind", s); }
StatusOr<WorkerStatus> ParseWorkerStatus(std::string_view s) { return Parse(kWorkerStatuses, "worker status", s); }
StatusOr<JobStatus> ParseJobStatus(std::string_view s) { return Parse(kJobStatuses, "job status", s); }
StatusOr<RoundStatus> ParseRoundStatus(std::string_view s) { return Parse(kRoundStatuses, "round status", s); }
StatusOr<UpdateStatus> ParseUpdateStatus(std::string_view s) { return Parse(kUpdateStatuses, "update status", s); }
StatusOr<ProjectRole> ParseProjectRole(std::string_view s) { return Parse(kProjectRoles, "project role", s); }

bool IsTerminal(JobStatus status) { return status != JobStatus::kQueued && status != JobStatus::kRunning; }

StatusOr<std::unique_ptr<MetadataStore>> OpenMetadataStore(std::string_view uri) {
  constexpr std::string_view kSupported =
      "supported: sqlite:///absolute/path.db, a plain path, :memory:, or "
      "postgres://USER:PASSWORD@HOST:PORT/DATABASE (postgresql:// too)";
  if (uri.empty()) return InvalidArgumentError("empty metadata store URI; " + std::string(kSupported));
  if (IsPostgresUri(uri)) {
    PARSYN_ASSIGN_OR_RETURN(auto store, PostgresMetadataStore::Open(uri));
    return std::unique_ptr<MetadataStore>(std::move(store));
  }
  std::string path(uri);
  if (uri.starts_with("sqlite://")) {
    // sqlite:///abs/path.db -> /abs/path.db ; sqlite://rel/path.db -> rel/path.db
    path = std::string(uri.substr(9));
    if (path.empty()) return InvalidArgumentError("metadata store URI '" + std::string(uri) + "' names no file");
  } else if (size_t scheme_end = uri.find("://"); scheme_end != std::string_view::npos) {
    // The rest may hold a password: only the scheme is repeated.
    return InvalidArgumentError("metadata store URI scheme '" + std::string(uri.substr(0, scheme_end)) +
                                "' is not supported; " + std::string(kSupported));
  }
  PARSYN_ASSIGN_OR_RETURN(auto store, SqliteMetadataStore::Open(path));
  return std::unique_ptr<MetadataStore>(std::move(store));
}

Status MetadataStore::RecordWorkersSeen(std::span<const WorkerSeen> seen) {
  for (const WorkerSeen& w : seen) {
    StatusOr<Worker> worker = GetWorker(w.worker_id);
    if (worker.status().code() == StatusCode::kNotFound) continue;
    PARSYN_RETURN_IF_ERROR(worker.status());
    worker->last_heartbeat_at_ms = w.last_heartbeat_at_ms;
    PARSYN_RETURN_IF_ERROR(UpdateWorker(*worker));
  }
  return Status::Ok();
}

StatusOr<LeaderLease> MetadataStore::AcquireLeaderLease(std::string_view holder, std::string_view holder_url,
                                                        std::chrono::milliseconds) {
  return LeaderLease{.held = true, .epoch = 1, .holder = std::string(holder), .holder_url = std::string(holder_url)};
}

Status MetadataStore::ReleaseLeaderLease(std::string_view) { return Status::Ok(); }

Status ForEachJobEventOfType(MetadataStore& store, int64_t job_id, std::string_view type,
                             const std::function<void(const JobEvent&)>& visit) {
  for (int64_t after = 0;;) {
    PARSYN_ASSIGN_OR_RETURN(std::vector<JobEvent> page,
                            store.ListJobEvents(job_id, after, 1000, {.type = std::string(type)}));
    if (page.empty()) return Status::Ok();
    for (const JobEvent& e : page) visit(e);
    after = page.back().id;
  }
}

}  // namespace parsyn::storage
