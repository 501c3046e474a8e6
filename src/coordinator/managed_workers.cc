// Managed workers' lifecycle on the service: revocation (an operator's DELETE, a pod registering again under its
// name, a pod gone for longer than --managed-worker-absence-s).
#include "coordinator/service.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include "base/log.h"
#include "coordinator/api_json.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

http::Awaitable<StatusOr<storage::Worker>> Service::RevokeWorker(int64_t id, std::string why) {
  auto revoke = loop::Offload(pool_, [this, id]() -> StatusOr<storage::Worker> {  // kCoAwaitTemporaries
    PARSYN_ASSIGN_OR_RETURN(storage::Worker w, store_->GetWorker(id));
    w.revoked = true;
    w.status = storage::WorkerStatus::kOffline;
    PARSYN_RETURN_IF_ERROR(store_->UpdateWorker(w));
    return w;
  });
  StatusOr<storage::Worker> revoked = co_await std::move(revoke);
  if (!revoked.ok()) co_return revoked;
  worker_tokens_.Revoke(id);
  auto ended = EndSession(id, why);  // kCoAwaitTemporaries
  co_await std::move(ended);
  feed_.NoteWorkerChange(id, worker_tokens_.FeedProject(id), WorkerJson(*revoked));  // the dashboard's stream
  PARSYN_LOG_INFO("worker {} ({}) revoked: {}", id, revoked->name, why);
  co_return revoked;
}

http::Awaitable<void> Service::RevokeAbsentManagedWorkers() {
  const std::chrono::seconds absence = options_.managed_worker_absence;
  if (absence.count() <= 0) co_return;
  const int64_t cutoff_ms =
      clock_.UnixMillis() - std::chrono::duration_cast<std::chrono::milliseconds>(absence).count();
  auto list = loop::Offload(pool_, [this] { return store_->ListWorkers(); });  // kCoAwaitTemporaries
  StatusOr<std::vector<storage::Worker>> workers = co_await std::move(list);
  if (!workers.ok()) {
    PARSYN_LOG_WARN("looking for absent managed workers: {}", workers.status().ToString());
    co_return;
  }
  for (const storage::Worker& w : *workers) {
    if (w.kind != storage::WorkerKind::kManaged || w.revoked || sessions_->Find(w.id) != nullptr) continue;
    const int64_t last_seen_ms = w.last_heartbeat_at_ms.value_or(w.created_at_ms);
    if (last_seen_ms > cutoff_ms) continue;
    auto revoke = RevokeWorker(w.id, "not heard from for more than " + std::to_string(absence.count()) +
                                         " s (--managed-worker-absence-s)");  // kCoAwaitTemporaries
    StatusOr<storage::Worker> revoked = co_await std::move(revoke);
    if (!revoked.ok()) PARSYN_LOG_WARN("revoking absent worker {}: {}", w.id, revoked.status().ToString());
  }
}

}  // namespace parsyn::coordinator
