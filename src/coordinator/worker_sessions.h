// WorkerSessions: the coordinator's live worker sessions (one per worker since its hello): presence (when each was
// last seen, and which of that the store has), task delivery (the queue of tasks assigned and not yet polled, the
// task delivered and not yet reported, the tasks to abandon in the next heartbeat) and worker status (online, busy,
// offline: noted for the dashboard's stream and, when it matters after a restart, stored).
//
// Sessions live in memory only: a restart or a change of leader ends them all (every worker starts offline and says
// hello again). The store gets a status change when it happens (except busy <-> online, which stays in the session)
// and presence in one commit for all workers every presence_flush_interval (FlushPresence).
//
// Threads: the service's event loop only (no locks); store calls run on the pool given (loop::Offload).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "coordinator/job_host.h"
#include "http/server.h"
#include "loop/signal.h"
#include "protocol/messages.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

class WorkerSessions {
 public:
  struct Session {
    int64_t worker_id = 0;
    std::string session_id;
    Clock::TimePoint last_seen{};
    int polls_in_flight = 0;
    struct QueuedTask {
      int64_t job_id = 0;
      TaskMessage task;
    };
    std::deque<QueuedTask> queued;       // assigned, not yet delivered
    uint64_t tasks_assigned = 0;         // DeliverTask calls: tells a stale availability offer (OfferWorker)
    std::optional<int64_t> current_job;  // delivered, not yet reported
    // The round and attempt of the task of current_job (not a copy of the task: 10,000 of those a round were a
    // measurable share of the loop's time in copies and frees).
    int current_round = 0;
    int current_attempt = 0;
    std::vector<protocol::AbandonedTask> abandon;  // tasks to drop, sent with the next heartbeat
    std::set<int64_t> jobs_served;  // jobs this session was handed tasks of, until a heartbeat says they ended
    // What the store last got for this session: a heartbeat that changes no status is kept in memory (last_seen)
    // and reaches the store with the next presence flush (FlushPresence), in one commit for all workers.
    std::optional<storage::WorkerStatus> stored_status;
    // online or busy now. Once the hello's "online" is stored, busy/online changes (two per task) stay here: they
    // are presence, which a restart rebuilds (every worker starts offline), so they cost no commit; GET /workers
    // and the event stream show this.
    storage::WorkerStatus status = storage::WorkerStatus::kOnline;
    Clock::TimePoint presence_stored_at{};  // the last_seen the store holds
    std::shared_ptr<loop::Signal> wake;     // a task was queued (shared: a long-poll may outlive the session)
    // What the hello said of the worker's own data file (its format and rows; nothing of it leaves the worker).
    std::optional<protocol::LocalData> local_data;
    // The trainers the hello announced (the built-in one, any model kind, when it named none), and the same as the
    // worker record keeps them (storage::Worker::trainers_json), written with the hello's status.
    std::vector<protocol::OfferedTrainer> trainers;
    std::string trainers_json;
    WorkerCapacity capacity;  // the hello's device_memory_bytes and lora_rank
  };
  // Where worker changes go for the dashboard's stream (FeedPublisher::NoteWorkerChange).
  using NoteWorkerChange = std::function<void(int64_t worker_id, const nlohmann::json& fields)>;

  // Sessions' signals and status writes run on `executor` (the loop); store calls on `pool`.
  WorkerSessions(boost::asio::any_io_executor executor, const Clock& clock, storage::MetadataStore& store,
                 boost::asio::thread_pool& pool, NoteWorkerChange note_worker_change);

  Session* Find(int64_t worker_id);
  const Session* Find(int64_t worker_id) const;
  // Every session, by worker id (unordered: sort the ids where the order matters).
  const std::unordered_map<int64_t, Session>& all() const { return sessions_; }
  // A new session for the worker's hello (its trainers, its own data). The worker must have none (Close it first).
  Session& Open(int64_t worker_id, std::string session_id, const protocol::Hello& hello);
  // Ends the worker's session in memory (a long-poll of it returns); false when it had none. The jobs and the
  // store are the caller's to tell (Service::EndSession).
  bool Close(int64_t worker_id, std::string_view why);
  // Wakes every session's long-poll (shutdown).
  void WakeAll();
  // The workers, in id order, without a poll open and not seen for longer than `timeout` before `now`.
  std::vector<int64_t> Silent(Clock::TimePoint now, std::chrono::milliseconds timeout) const;

  // ---- Task delivery (JobHost's, for the job runners). ----
  // Queues a task for a worker and wakes its long-poll. False when the worker has no session (it went away).
  bool DeliverTask(int64_t worker_id, int64_t job_id, TaskMessage task);
  // Tells a worker to drop a task (straggler, job ended): removed if not yet delivered, else reported in its next
  // heartbeat's "abandon" list.
  void AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt);
  // The worker's delivered task of this job is over (reported, refused or the job ended).
  void TaskFinished(int64_t worker_id, int64_t job_id);
  // A task poll of the session starts: the worker is seen now, holds no task any more (polling while holding one
  // means it dropped it), is online unless a task is queued for it, and has one more poll open (IdleWorkers counts it
  // idle while one is).
  void PollStarted(Session& s);
  // The poll's wait is over: one poll fewer open.
  void PollEnded(Session& s) { s.polls_in_flight--; }
  // Hands the first queued task to the worker, now seen: it becomes the task the worker holds (current_job, and its
  // round and attempt). The task's JSON; nullopt when none is queued.
  std::optional<std::string> HandOverQueuedTask(Session& s);
  // Workers online with nothing to do: the engine's idle set when a job starts or resumes. In id order.
  std::vector<int64_t> IdleWorkers() const;
  bool WorkerHasLocalData(int64_t worker_id) const;
  bool WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view model_kind) const;
  WorkerCapacity AnnouncedCapacity(int64_t worker_id) const;

  // ---- Status and presence. ----
  // A worker's status (and device, from a hello) for the dashboard, its session and, when the store does not show
  // the session yet or it ends, the store.
  http::Awaitable<void> SetWorkerStatus(int64_t worker_id, storage::WorkerStatus status, std::string_view device = {});
  // The same without waiting for a store write (task delivery and completion).
  void UpdateWorkerStatus(int64_t worker_id, storage::WorkerStatus status);
  // Writes the last_seen of every worker seen since its last store write, in one commit (the service's timer does so
  // every presence_flush_interval, and its destructor writes UnstoredPresence once more). On the loop.
  http::Awaitable<void> FlushPresence();
  // The last_seen of sessions seen since their last store write: what FlushPresence writes, in one commit.
  std::vector<storage::WorkerSeen> UnstoredPresence() const;
  void MarkPresenceStored(std::span<const storage::WorkerSeen> seen, Clock::TimePoint as_of);

 private:
  // A worker that holds no task and has none queued is online (a task's end and a poll's start call this; a change
  // of nothing notes nothing).
  void OnlineWhenIdle(Session& s);
  // Notes the change for the dashboard and in the session; true when that is all it takes (busy <-> online of a
  // connected worker whose session the store already shows), false when the store must be written.
  bool NoteWorkerStatus(int64_t worker_id, storage::WorkerStatus status, const std::string& device, int64_t now_ms);
  http::Awaitable<void> StoreWorkerStatus(int64_t worker_id, storage::WorkerStatus status, std::string device,
                                          int64_t now_ms, Clock::TimePoint as_of);

  boost::asio::any_io_executor executor_;
  const Clock& clock_;
  storage::MetadataStore& store_;
  boost::asio::thread_pool& pool_;
  NoteWorkerChange note_worker_change_;
  // A hash map: looking a session up in a tree of 10,000 was 2% of the loop in a round (a cache miss per level).
  // Node-based like std::map, so a Session& stays valid while others come and go; where the order matters (which
  // idle worker gets which shard) the ids are sorted.
  std::unordered_map<int64_t, Session> sessions_;
};

}  // namespace parsyn::coordinator
