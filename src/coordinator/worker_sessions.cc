#include "coordinator/worker_sessions.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "base/log.h"
#include "coordinator/api_json.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

using nlohmann::json;

WorkerSessions::WorkerSessions(boost::asio::any_io_executor executor, const Clock& clock, storage::MetadataStore& store,
                               boost::asio::thread_pool& pool, NoteWorkerChange note_worker_change)
    : executor_(std::move(executor)),
      clock_(clock),
      store_(store),
      pool_(pool),
      note_worker_change_(std::move(note_worker_change)) {}

WorkerSessions::Session* WorkerSessions::Find(int64_t worker_id) {
  auto it = sessions_.find(worker_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const WorkerSessions::Session* WorkerSessions::Find(int64_t worker_id) const {
  auto it = sessions_.find(worker_id);
  return it == sessions_.end() ? nullptr : &it->second;
}

WorkerSessions::Session& WorkerSessions::Open(int64_t worker_id, std::string session_id, const protocol::Hello& hello) {
  Session& s = sessions_[worker_id];
  s.worker_id = worker_id;
  s.session_id = std::move(session_id);
  s.last_seen = clock_.Now();
  s.wake = std::make_shared<loop::Signal>(executor_);
  s.local_data = hello.local_data;
  s.trainers = hello.trainers;
  if (s.trainers.empty()) s.trainers.push_back({.name = std::string(protocol::kBuiltinTrainer), .description = {}});
  s.trainers_json = protocol::OfferedTrainersToJsonText(s.trainers);
  s.capacity = {.device_memory_bytes = hello.device_memory_bytes, .lora_rank = hello.lora_rank};
  return s;
}

bool WorkerSessions::Close(int64_t worker_id, std::string_view why) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return false;
  PARSYN_LOG_INFO("worker {}: session ended ({})", worker_id, why);
  it->second.wake->Notify();  // a long-poll of the old session returns
  sessions_.erase(it);
  return true;
}

void WorkerSessions::WakeAll() {
  for (auto& [id, s] : sessions_) s.wake->Notify();
}

std::vector<int64_t> WorkerSessions::Silent(Clock::TimePoint now, std::chrono::milliseconds timeout) const {
  std::vector<int64_t> silent;
  for (const auto& [id, s] : sessions_) {
    if (s.polls_in_flight == 0 && now - s.last_seen > timeout) silent.push_back(id);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

bool WorkerSessions::DeliverTask(int64_t worker_id, int64_t job_id, TaskMessage task) {
  Session* s = Find(worker_id);
  if (s == nullptr) return false;
  s->queued.push_back({.job_id = job_id, .task = std::move(task)});
  s->tasks_assigned++;
  s->wake->Notify();
  UpdateWorkerStatus(worker_id, storage::WorkerStatus::kBusy);
  return true;
}

void WorkerSessions::AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt) {
  Session* s = Find(worker_id);
  if (s == nullptr) return;
  std::erase_if(s->queued, [&](const Session::QueuedTask& t) {
    return t.job_id == job_id && t.task.round == round && t.task.attempt == attempt;
  });
  if (s->current_job == job_id && s->current_round == round && s->current_attempt == attempt) {
    s->abandon.push_back({.job_id = job_id, .round = round, .attempt = attempt});
    s->current_job.reset();
  }
}

void WorkerSessions::TaskFinished(int64_t worker_id, int64_t job_id) {
  Session* s = Find(worker_id);
  if (s == nullptr || s->current_job != job_id) return;
  s->current_job.reset();
  OnlineWhenIdle(*s);
}

void WorkerSessions::PollStarted(Session& s) {
  s.last_seen = clock_.Now();
  s.current_job.reset();
  s.polls_in_flight++;
  // A worker sends no heartbeat while its poll is open: a task that ended without a report (refused, abandoned when
  // its job ended) would otherwise leave it busy until a task came.
  OnlineWhenIdle(s);
}

void WorkerSessions::OnlineWhenIdle(Session& s) {
  if (!s.current_job && s.queued.empty() && s.status != storage::WorkerStatus::kOnline) {
    UpdateWorkerStatus(s.worker_id, storage::WorkerStatus::kOnline);
  }
}

std::optional<std::string> WorkerSessions::HandOverQueuedTask(Session& s) {
  s.last_seen = clock_.Now();
  if (s.queued.empty()) return std::nullopt;
  Session::QueuedTask task = std::move(s.queued.front());
  s.queued.pop_front();
  s.current_job = task.job_id;
  s.jobs_served.insert(task.job_id);
  s.current_round = task.task.round;
  s.current_attempt = task.task.attempt;
  return std::move(task.task.json);
}

std::vector<int64_t> WorkerSessions::IdleWorkers() const {
  std::vector<int64_t> idle;
  for (const auto& [id, s] : sessions_) {
    if (s.polls_in_flight > 0 && s.queued.empty() && !s.current_job) idle.push_back(id);
  }
  std::sort(idle.begin(), idle.end());
  return idle;
}

bool WorkerSessions::WorkerHasLocalData(int64_t worker_id) const {
  auto it = sessions_.find(worker_id);
  return it != sessions_.end() && it->second.local_data.has_value();
}

bool WorkerSessions::WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view model_kind) const {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return false;
  for (const protocol::OfferedTrainer& t : it->second.trainers) {
    if (t.name != name) continue;
    // A trainer of unknown kinds (an older worker's built-in one) is asked to try; the contract's checks stand.
    return t.description.model_kinds.empty() || t.description.TrainsModelKind(model_kind);
  }
  return false;
}

WorkerCapacity WorkerSessions::AnnouncedCapacity(int64_t worker_id) const {
  auto it = sessions_.find(worker_id);
  return it == sessions_.end() ? WorkerCapacity{} : it->second.capacity;
}

bool WorkerSessions::NoteWorkerStatus(int64_t worker_id, storage::WorkerStatus status, const std::string& device,
                                      int64_t now_ms) {
  // Noted for the dashboard's stream now, in the loop's order of changes (the store writes may finish out of order),
  // with the job as GET /workers shows it: that of the delivered, else first queued, task.
  json change = {{"status", storage::ToString(status)}, {"last_heartbeat_at_ms", now_ms}, {"current_job_id", nullptr}};
  if (!device.empty()) change["device"] = device;
  Session* session = Find(worker_id);
  if (session != nullptr) {
    if (session->current_job)
      change["current_job_id"] = *session->current_job;
    else if (!session->queued.empty())
      change["current_job_id"] = session->queued.front().job_id;
    // A hello (the one status change with a device): the trainers it announced.
    if (!device.empty()) change["trainers"] = WorkerTrainersJson(session->trainers_json);
  }
  note_worker_change_(worker_id, change);
  if (session == nullptr) return false;
  session->status = status;
  // Busy <-> online of a connected worker whose session the store already shows: memory only (Session::status).
  const bool stored_connected = session->stored_status && *session->stored_status != storage::WorkerStatus::kOffline;
  return stored_connected && status != storage::WorkerStatus::kOffline && device.empty();
}

http::Awaitable<void> WorkerSessions::SetWorkerStatus(int64_t worker_id, storage::WorkerStatus status,
                                                      std::string_view device_view) {
  const std::string device(device_view);
  const int64_t now = clock_.UnixMillis();
  const Clock::TimePoint as_of = clock_.Now();
  if (NoteWorkerStatus(worker_id, status, device, now)) co_return;
  co_await StoreWorkerStatus(worker_id, status, device, now, as_of);
}

void WorkerSessions::UpdateWorkerStatus(int64_t worker_id, storage::WorkerStatus status) {
  // Two of these per task (busy, online): no coroutine unless the store is written.
  const int64_t now = clock_.UnixMillis();
  const Clock::TimePoint as_of = clock_.Now();
  if (NoteWorkerStatus(worker_id, status, "", now)) return;
  boost::asio::co_spawn(executor_, StoreWorkerStatus(worker_id, status, "", now, as_of), boost::asio::detached);
}

http::Awaitable<void> WorkerSessions::StoreWorkerStatus(int64_t worker_id, storage::WorkerStatus status,
                                                        std::string device, int64_t now_ms, Clock::TimePoint as_of) {
  // The session's trainers go with every write of the row, so that no write of an older read drops them.
  const Session* session_now = Find(worker_id);
  const std::string trainers_json = session_now != nullptr ? session_now->trainers_json : "";
  Status s = co_await loop::Offload(pool_, [&]() -> Status {
    PARSYN_ASSIGN_OR_RETURN(storage::Worker w, store_.GetWorker(worker_id));
    w.status = status;
    if (!device.empty()) w.device = device;
    if (!trainers_json.empty()) w.trainers_json = trainers_json;
    w.last_heartbeat_at_ms = now_ms;
    return store_.UpdateWorker(w);
  });
  if (!s.ok()) {
    PARSYN_LOG_WARN("worker {}: status not stored: {}", worker_id, s.ToString());
  } else if (Session* session = Find(worker_id)) {
    session->stored_status = status;
    session->presence_stored_at = std::max(session->presence_stored_at, as_of);
  }
}

std::vector<storage::WorkerSeen> WorkerSessions::UnstoredPresence() const {
  const Clock::TimePoint now = clock_.Now();
  const int64_t unix_now = clock_.UnixMillis();
  std::vector<storage::WorkerSeen> seen;
  for (const auto& [id, s] : sessions_) {
    if (s.last_seen <= s.presence_stored_at) continue;
    seen.push_back({.worker_id = id, .last_heartbeat_at_ms = unix_now - (now - s.last_seen).count()});
  }
  return seen;
}

void WorkerSessions::MarkPresenceStored(std::span<const storage::WorkerSeen> seen, Clock::TimePoint as_of) {
  for (const storage::WorkerSeen& w : seen) {
    if (Session* s = Find(w.worker_id)) s->presence_stored_at = std::max(s->presence_stored_at, as_of);
  }
}

http::Awaitable<void> WorkerSessions::FlushPresence() {
  const Clock::TimePoint as_of = clock_.Now();
  std::vector<storage::WorkerSeen> seen = UnstoredPresence();
  if (seen.empty()) co_return;
  Status s = co_await loop::Offload(pool_, [&] { return store_.RecordWorkersSeen(seen); });
  if (!s.ok()) {
    PARSYN_LOG_WARN("presence of {} worker(s) not stored (kept in memory, retried): {}", seen.size(), s.ToString());
    co_return;
  }
  MarkPresenceStored(seen, as_of);
  for (const storage::WorkerSeen& w : seen)
    note_worker_change_(w.worker_id, {{"last_heartbeat_at_ms", w.last_heartbeat_at_ms}});
}

}  // namespace parsyn::coordinator
