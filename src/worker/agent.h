// The worker agent behind `parsyn worker` (docs/architecture.md §4): one session with the coordinator at a time (hello,
// long-polls for tasks, a heartbeat thread, goodbye) and one task at a time, trained by the trainer the task's job
// names (config.trainer) among those the worker offers, in a child process under the trainer contract
// (docs/trainer-contract.md, TrainerSupervisor), so that a crash there never takes the agent down. The hello announces
// the offered trainers with their `--describe` answers; the coordinator sends a job's tasks only to workers offering
// its trainer, and a task naming one this worker lacks fails with the reason.
//
// Per task: the base model comes from the checksum cache (fetched once across rounds and jobs), the round's global
// weights and the worker's shard through the task's signed URLs, all verified by sha256 where the task gives one
// (shards have none); progress goes to the coordinator every progress_interval; before uploading, a heartbeat
// confirms the session and the task are still current, so no update is uploaded for a round that has moved on.
// With local_data set, the hello announces the file (format and rows, nothing of its contents) and the worker takes
// tasks of jobs over the workers' own data (data_source "workers"): it trains on that file, split into train and
// validation by the job's seed, and only weights and metrics leave the machine; its sample count is its training
// split's. Tasks of platform jobs still train on the shard they name. A "workers" task on a worker without
// local_data, or whose model does not fit the file's format, fails with the reason.
//
// Presence on one connection (docs/operations.md, "Worker presence"): an idle worker holds only its long-poll, which
// keeps its session alive; the heartbeat thread sends heartbeats every heartbeat_interval only while no poll is open
// (a task in progress, or backing off between polls), on the same client, so an idle worker holds one connection.
//
// Several coordinator URLs (failover, docs/operations.md "Failover"): hello goes to each in turn, starting with the
// last that answered, until one accepts (a standby answers 503); a session whose coordinator stops answering a poll
// ends at once, and the agent says hello again, to the next URL first, so it follows the leader within a backoff.
//
// Failures: connection errors, coordinator restarts (the old session is unknown: FailedPrecondition) and expired
// sessions lead to a new hello after a capped exponential backoff; a task that fails (bad download, trainer crash,
// failed upload) is logged, reported once through POST /api/v1/worker/failure {"job_id", "round", "attempt",
// "reason"} so the coordinator drops it from the round at once (errors there are logged and ignored: the next
// long-poll tells it too), and the agent stays online. Tasks that were stopped, abandoned by the coordinator or whose
// round moved on are not reported. Only a rejected token (Unauthenticated, PermissionDenied) ends Run with an error:
// a 401/403 on any worker route (hello, poll, heartbeat, progress, result, failure) stops the current trainer at
// once, skips its upload, and ends Run ("the coordinator refused this worker's token (revoked?): stopping").
//
// Blob transfers (model files, global weights, shards, the update: see update_upload.h) go through a second client
// without the worker's token: their URLs are signed in the query (coordinator /blobs URLs or S3 presigned URLs). It
// presents the same client certificate, which a coordinator with mutual TLS also requires on /blobs.
//
// Threads: Run() blocks its caller and starts one heartbeat thread per session; RequestStop on the stop_source
// behind Run's token may come from any thread (a signal watcher): it stops the trainer, says goodbye and returns.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "http/client.h"
#include "protocol/messages.h"
#include "worker/blob_cache.h"
#include "worker/task_translation.h"
#include "worker/trainer_launcher.h"
#include "worker/trainer_supervisor.h"

namespace parsyn::worker {

class SecureParticipation;  // secure_participation.h

struct AgentOptions {
  // "http://127.0.0.1:8080", or several coordinators of one platform separated by commas (failover: a standby
  // answers 503, so the agent says hello to each in turn until one, the leader, accepts it; SplitServerUrls).
  std::string server_url;
  std::string token;  // from `parsyn worker register`
  std::string name;   // for logs
  // The name comes from the coordinator: `name` is used only until the hello answer gives the registered name.
  bool name_from_coordinator = false;
  std::string device = "cpu";
  // What the hello announces of the worker's capacity (docs/training.md "Workers of different ranks"): the device's
  // memory (0: measured, DeviceMemoryBytes) and the highest LoRA rank it trains (0: any).
  uint64_t device_memory_bytes = 0;
  int lora_rank = 0;
  std::filesystem::path local_data;  // .csv or .jsonl for jobs whose data.source is "workers"; empty: none
  std::filesystem::path cache_dir;   // models, shards, task folders
  // The trainers this worker offers, by name (distinct), described; "builtin" among them (`parsyn worker` adds
  // parsyn-trainer under that name unless --trainer maps it to another command).
  std::vector<DescribedTrainer> trainers;
  int trainer_threads = 0;  // the trainers' intra-op threads (the task file's "threads"; 0: the framework's default)
  // TLS: extra trusted CAs for the coordinator's certificate, and this worker's client certificate and key for a
  // coordinator that requires them (mutual TLS); both clients (API and blobs) use them.
  std::filesystem::path ca_file;
  std::filesystem::path client_cert_file;
  std::filesystem::path client_key_file;
  // Secure aggregation: the CA of the workers' certificates, to check the keys peers advertise (empty: not checked
  // here; the coordinator checks them under mutual TLS). With client_cert_file, this worker signs its own keys.
  std::filesystem::path peer_ca_file;
  std::chrono::milliseconds progress_interval{2'000};
  std::chrono::milliseconds backoff_initial{500};
  std::chrono::milliseconds backoff_max{15'000};
};

// What the agent has done, for tests and the final log line.
struct AgentCounters {
  std::atomic<int> sessions{0};
  std::atomic<int> tasks_completed{0};
  std::atomic<int> tasks_failed{0};
  std::atomic<int> uploads_skipped{0};    // the round moved on before the update could be uploaded
  std::atomic<int> failures_reported{0};  // failed tasks the coordinator accepted a /worker/failure report for
  std::atomic<int> heartbeats{0};         // sent by the heartbeat thread (none while a long-poll is open)
};

// "URL1,URL2,..." as a list: spaces around the commas and trailing slashes dropped, empty items skipped.
std::vector<std::string> SplitServerUrls(std::string_view urls);

class Agent {
 public:
  Agent(AgentOptions options, TrainerLauncher& launcher);
  ~Agent();

  // Runs sessions until `stop` (then goodbye; OK) or a rejected token (Unauthenticated / PermissionDenied).
  Status Run(std::stop_token stop);
  const AgentCounters& counters() const { return counters_; }

 private:
  struct Session {
    std::string id;
    int64_t worker_id = 0;  // as the hello answer says: names this worker's task folders in a shared cache
    std::chrono::milliseconds heartbeat_interval{5'000};
    std::chrono::milliseconds max_poll_wait{30'000};
  };
  // The task in progress, shared with the heartbeat thread (guarded by mutex_).
  struct CurrentTask {
    int64_t job_id = 0;
    int round = 0;
    int attempt = 0;
    bool abandoned = false;  // the coordinator dropped it, or the session ended
    std::string why;
    bool result_posted = false;  // the coordinator accepted the result call (even if it rejected the update)
    std::stop_source stop;       // requested on abandon: downloads, training (SIGTERM) and the upload stop at once
  };

  StatusOr<Session> Hello(std::stop_token stop);
  // Points client_ and blob_client_ at urls_[url_index].
  void MakeClients(size_t url_index);
  // Hello to one coordinator URL (the clients are made for it).
  StatusOr<Session> HelloTo(size_t url_index, std::stop_token stop);
  // Polls and runs tasks until the session ends (FailedPrecondition), the coordinator is unreachable (Unavailable,
  // ...) or `stop` (OK, after goodbye).
  Status RunSession(const Session& session, std::stop_token stop);
  void HeartbeatLoop(const Session& session, std::stop_token stop);
  // One heartbeat; applies its abandon list to the current task. FailedPrecondition when the session is gone.
  Status Heartbeat(const Session& session);
  // Marks the current task abandoned (when it matches, or always with job_id 0) and stops its trainer.
  void AbandonCurrent(int64_t job_id, int round, int attempt, const std::string& why);
  // Reads the task (protocol::Task) and runs it; a malformed one is logged and dropped.
  void RunTask(const Session& session, const nlohmann::json& task_json, std::stop_token stop);
  // POSTs /api/v1/worker/failure once; failures to deliver it are logged and ignored.
  void ReportFailure(const protocol::Task& task, const Status& failure);
  Status ExecuteTask(const Session& session, const protocol::Task& task, std::stop_token stop);
  // A secure round's phases 1 and 2, signing with the worker's certificate and checking peers under --peer-ca.
  StatusOr<SecureParticipation> JoinSecureRound(const Session& session, const protocol::Task& task,
                                                std::stop_token stop);
  // POST /api/v1/worker/result, with a secure round's revealing of shares (phase 4) beside it when `secure` is set.
  StatusOr<http::ClientResponse> PostResult(const protocol::Result& report, SecureParticipation* secure,
                                            std::stop_token stop);
  StatusOr<TaskFiles> FetchInputs(const Session& session, const protocol::Task& task,
                                  const std::filesystem::path& task_dir, std::stop_token stop);
  // Downloads the round's global weights to `global_weights` and checks their sha256: from their delta when the task
  // offers one from the global this worker holds for the job (global_downlink.h), else through their zstd copy when
  // the task offers one, else whole. A job that sends deltas has its global held for the next task.
  Status FetchGlobalWeights(const Session& session, const protocol::Task& task, const std::filesystem::path& task_dir,
                            const std::filesystem::path& global_weights, std::stop_token stop);
  // Runs `trainer` on the task file through the supervisor, reporting its progress; returns its checked output.
  StatusOr<TrainerOutput> RunTrainer(const Session& session, const protocol::Task& task, const TrainerCommand& trainer,
                                     const std::filesystem::path& task_file, const protocol::TrainerTask& trainer_task,
                                     std::stop_token stop);
  // The offered trainer the task's job names; FailedPrecondition naming the ones offered when there is none.
  StatusOr<const DescribedTrainer*> TrainerFor(const protocol::Task& task) const;
  bool CurrentAbandoned(std::string* why);
  // On 401/403 from the coordinator (the token was revoked or is wrong): logs it once, stops the current task's
  // trainer, and makes the session and Run end; nothing more is trained or uploaded with that token.
  void NoteTokenRefused(const Status& status);

  AgentOptions options_;
  TrainerSupervisor supervisor_;
  std::vector<std::string> urls_;  // options_.server_url, split
  size_t url_index_ = 0;           // the coordinator of the current session (the leader, with several)
  // Made for urls_[url_index_] by HelloTo, between sessions, when no other thread of this agent uses them.
  std::unique_ptr<http::Client> client_;       // the coordinator's API, with the worker's token
  std::unique_ptr<http::Client> blob_client_;  // signed blob URLs: no token
  BlobCache cache_;
  AgentCounters counters_;
  std::mutex mutex_;
  std::optional<CurrentTask> current_;
  std::atomic<bool> session_lost_{false};
  // A long-poll is in flight: the heartbeat thread sends nothing meanwhile. Set under poll_mutex_, which a heartbeat
  // holds while it is sent, so a heartbeat and a poll never overlap (one connection).
  std::mutex poll_mutex_;
  std::atomic<bool> poll_open_{false};
  std::atomic<bool> token_refused_{false};
};

}  // namespace parsyn::worker
