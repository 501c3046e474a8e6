// Managed workers of `parsyn server --managed-workers N`: N local `parsyn worker` processes of kind managed that the
// server starts, restarts when they exit (capped exponential backoff) and stops on shutdown.
//
// Identity: worker i is named "managed-<i>". The store keeps only token hashes, so each token lives in
// <data_dir>/managed-workers/managed-<i>.token (mode 0600); a missing, unknown or revoked token gets a fresh
// managed worker (a new id). Each worker caches under <data_dir>/managed-workers/managed-<i>/.
//
// Threads: EnsureManagedWorkers blocks (store and files) and must run before the coordinator opens the store, so
// the coordinator loads the tokens. ManagedWorkerSupervisor runs one supervising thread per worker, off the
// coordinator's event loop; its methods are called from one thread (the server's), RequestStop also from a signal
// handler's completion on the loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/subprocess.h"

namespace parsyn::cli {

struct ManagedWorkerIdentity {
  int64_t id = 0;  // the store's worker id
  std::string name;
  std::string token;
  std::filesystem::path cache_dir;
};

// Makes sure managed workers managed-1..managed-<count> exist in the metadata store under `data_dir` (creating the
// directory, database, token files and cache directories as needed). Unavailable on file or store errors.
StatusOr<std::vector<ManagedWorkerIdentity>> EnsureManagedWorkers(const std::filesystem::path& data_dir, int count);

struct SupervisorOptions {
  std::filesystem::path program;  // the `parsyn` executable
  std::string server_url;         // what the workers connect to
  std::string device = "cpu";     // --device of each worker
  std::chrono::milliseconds initial_backoff{1'000};
  std::chrono::milliseconds max_backoff{30'000};
  // A worker that ran at least this long before exiting restarts after initial_backoff again.
  std::chrono::milliseconds healthy_run{60'000};
};

class ManagedWorkerSupervisor {
 public:
  ManagedWorkerSupervisor(SupervisorOptions options, std::vector<ManagedWorkerIdentity> workers);
  // Stop()s.
  ~ManagedWorkerSupervisor();
  ManagedWorkerSupervisor(const ManagedWorkerSupervisor&) = delete;
  ManagedWorkerSupervisor& operator=(const ManagedWorkerSupervisor&) = delete;

  // Starts the supervising threads; each starts its worker at once. Call once.
  void Start();
  // Sends SIGTERM to every running worker (they say goodbye and exit) and stops restarting them. Does not block.
  void RequestStop();
  // True when no worker process is running (after RequestStop: all have exited).
  bool AllExited();
  // RequestStop, waits up to `grace` for the workers to exit, SIGKILLs those still running, joins the threads.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

 private:
  struct Slot {
    ManagedWorkerIdentity identity;
    Subprocess* child = nullptr;  // the running worker process (owned by `thread`), guarded by mutex_
    std::thread thread;
  };
  void Supervise(Slot& slot);

  SupervisorOptions options_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;  // a child cleared, or stopping_ set
  bool stopping_ = false;
  bool stopped_ = false;
};

}  // namespace parsyn::cli
