// JobHost: what a JobRunner needs of the coordinator around it, and nothing more: the stores, the URLs workers get
// for blobs, the thread pool and the loop's executor, the clock, a few settings, job events, and the worker
// sessions (task delivery, abandon, finish, who is idle). `Service` implements it; a unit test can implement it on
// MemoryBlobStore, FaultyMetadataStore and FakeClock (job_runner_test.cc).
//
// Threads: called on the event loop only (the stores themselves are called from the pool, through loop::Offload).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "coordinator/write_queue.h"
#include "http/server.h"
#include "secagg/client.h"
#include "storage/blob_store.h"
#include "storage/blob_urls.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// Added to a task's attempt timeout for its URLs' lifetime: a worker that finishes just in time can still upload.
inline constexpr std::chrono::minutes kTaskUrlMargin{5};

// A task on its way to its worker: the JSON text the worker's poll is answered with (protocol::TaskJsonText, written
// once when the task is built) and the fields the coordinator reads back.
struct TaskMessage {
  int round = 0;
  int attempt = 0;
  std::string json;
};

// What a worker's current session announced of its capacity (its hello), each absent when not said or when the
// worker has no session: its device's memory, and the highest LoRA rank it trains (`parsyn worker --lora-rank`).
struct WorkerCapacity {
  std::optional<int64_t> device_memory_bytes;
  std::optional<int> lora_rank;
};

class JobHost {
 public:
  virtual ~JobHost() = default;

  virtual storage::MetadataStore& store() = 0;
  virtual storage::BlobStore& blobs() = 0;
  // The URLs workers get for blobs: the store's own (S3 presigning) or the coordinator's signed /blobs URLs.
  virtual storage::BlobUrlIssuer& blob_urls() = 0;
  // Where worker `worker_id` GETs blob `key` for `ttl` (blob_urls(), falling back to a signed /blobs URL should
  // presigning fail). The coordinator's own URLs are bound to the worker: refused once it is revoked.
  virtual std::string BlobGetUrl(std::string_view key, std::chrono::seconds ttl, int64_t worker_id) const = 0;
  // Where worker `worker_id` PUTs blob `key` for `ttl` (single-part; bound to the worker like BlobGetUrl).
  virtual StatusOr<storage::UrlGrant> BlobPutGrant(std::string_view key, std::chrono::seconds ttl,
                                                   int64_t worker_id) const = 0;
  // How long the URLs in a task stay valid: the server's --blob-url-ttl when set, else the attempt's timeout plus a
  // margin (kTaskUrlMargin), at most what the blob store presigns.
  virtual std::chrono::seconds TaskUrlTtl(std::chrono::milliseconds attempt_timeout) const = 0;
  // For blocking work (store calls, blob I/O, validation, aggregation), through loop::Offload.
  virtual boost::asio::thread_pool& pool() = 0;
  // The event loop's.
  virtual boost::asio::any_io_executor executor() = 0;
  virtual const Clock& clock() const = 0;
  // Temporary local copies of blobs from stores without local files (LocalBlobCopy).
  virtual std::filesystem::path spool_dir() const = 0;
  // True when a round's updates stay in the blob store after it ends (`parsyn server --keep-updates`); else the job
  // deletes them once the round is committed or fails.
  virtual bool keep_updates() const = 0;

  // Appends a job event to the store (through the write queue below, waiting for its batch) and wakes the job's event
  // streams. Errors are logged, not returned: events describe changes already stored.
  virtual http::Awaitable<void> AppendEvent(int64_t job_id, std::string type, nlohmann::json payload) = 0;
  // Group commit (write_queue.h): queues the job's `records`, then its `events` (stamped with the host's clock), for
  // the host's next batch, one commit shared with whatever else is queued, and returns the ticket that says when they
  // are durable (WriteQueue::Wait). Events wake the job's streams once their batch is done. AppendEvent goes through
  // the same queue, so a job's writes land in the order they were made.
  struct QueuedEvent {
    std::string type;
    nlohmann::json payload;
  };
  virtual WriteQueue::TicketPtr QueueJobWrites(int64_t job_id, std::vector<storage::BatchWrite> records,
                                               std::vector<QueuedEvent> events) = 0;
  // Queues a task for a worker and wakes its long-poll. False when the worker has no session (it went away).
  virtual bool DeliverTask(int64_t worker_id, int64_t job_id, TaskMessage task) = 0;
  // Tells a worker to drop a task (straggler, job ended): removed if not yet delivered, else reported in its next
  // heartbeat's "abandon" list.
  virtual void AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt) = 0;
  // The worker's delivered task of this job is over (reported, refused or the job ended).
  virtual void TaskFinished(int64_t worker_id, int64_t job_id) = 0;
  // Workers online with nothing to do: the engine's idle set when a job starts or resumes.
  virtual std::vector<int64_t> IdleWorkers() const = 0;
  // Whether the worker's current session announced a data file of its own (hello's local_data): the workers that
  // may take part in a job whose data.source is "workers".
  virtual bool WorkerHasLocalData(int64_t worker_id) const = 0;
  // Whether the worker's current session offers the trainer `name` for models of `model_kind` (hello's trainers; a
  // hello without them offers the built-in trainer for any kind).
  virtual bool WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view model_kind) const = 0;
  // Whether the worker may train the jobs of project `project_id`: a managed worker any project's, an own worker
  // only its own project's.
  virtual bool WorkerServesProject(int64_t worker_id, int64_t project_id) const = 0;
  // What the worker's current session announced of its capacity (LoRA ranks of jobs of mixed ranks).
  virtual WorkerCapacity AnnouncedCapacity(int64_t worker_id) const = 0;
  // Checks the keys workers advertise in securely aggregated rounds (their signatures under the workers' CA, mutual
  // TLS); null where workers have no certificates (the honest-but-curious model: docs/secure-aggregation.md).
  virtual const secagg::KeyVerifier& secure_key_verifier() const {
    static const secagg::KeyVerifier none;
    return none;
  }
};

}  // namespace parsyn::coordinator
