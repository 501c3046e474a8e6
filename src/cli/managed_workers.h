// Managed workers of `parsyn server --managed-workers N`: N local `parsyn worker` processes of kind managed that the
// server starts, restarts when they exit (capped exponential backoff) and stops on shutdown.
//
// Identity: worker i is named "managed-<i>". The store keeps only token hashes, so each token lives in
// <data_dir>/managed-workers/managed-<i>.token (mode 0600); a missing, unknown or revoked token gets a fresh
// managed worker (a new id). Each worker caches under <data_dir>/managed-workers/managed-<i>/.
//
// TLS: on a server with --tls-cert, managed workers trust that certificate file (--ca-file) and connect to the
// --public-url when one is set (the name the certificate is for), else to the address the server listens on (then the
// certificate must name it, e.g. IP:127.0.0.1 for 0.0.0.0). With --client-ca they present client certificates that
// EnsureManagedWorkerCertificates issues from the managed workers' own CA (<data_dir>/managed-workers/ca.pem, its key
// beside it, 0600), which the server trusts besides --client-ca: nothing to set up by hand.
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
  std::filesystem::path cert_file;  // client certificate and key (EnsureManagedWorkerCertificates); empty: none
  std::filesystem::path key_file;
};

// Makes sure managed workers managed-1..managed-<count> exist in the metadata store (`metadata_uri`, as
// ServiceOptions::metadata_uri: empty for <data_dir>/metadata.db), creating the directory, database, token files and
// cache directories under `data_dir` as needed. Unavailable on file or store errors.
StatusOr<std::vector<ManagedWorkerIdentity>> EnsureManagedWorkers(const std::filesystem::path& data_dir, int count,
                                                                  const std::string& metadata_uri = "");

// Gives each of `workers` a client certificate for its worker id, issued by the managed workers' CA (created on
// first use); returns that CA's certificate file, for the server to trust. Certificates are issued afresh on every
// start (a worker id may have changed). Unavailable / Internal on file or OpenSSL errors.
StatusOr<std::filesystem::path> EnsureManagedWorkerCertificates(const std::filesystem::path& data_dir,
                                                                std::vector<ManagedWorkerIdentity>& workers);

struct SupervisorOptions {
  std::filesystem::path program;  // the `parsyn` executable
  std::string server_url;         // what the workers connect to
  std::string device = "cpu";     // --device of each worker
  std::filesystem::path ca_file;  // --ca-file of each worker (an https server_url); empty: none
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
