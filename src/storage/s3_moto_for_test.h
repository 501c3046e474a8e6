// Test helpers for the S3 store: find the Python that has boto3 and moto, and run a moto_server on loopback.
//
// moto_server is looked up on PATH, then in /root/.pyenv/shims (where these machines' Python keeps it); the Python
// beside it is the one with boto3. Tests skip (GTEST_SKIP, saying so) only when moto_server is not installed.
// Tests only; one thread per object.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace parsyn::storage {

// The moto_server executable, if installed.
std::optional<std::filesystem::path> FindMotoServer();
// The python3 beside moto_server (it has boto3 and botocore), if installed.
std::optional<std::filesystem::path> FindS3ReferencePython();

// Runs `argv` and returns its stdout. Internal if it cannot be started or exits non-zero (with its stderr).
StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv);

// A moto_server on 127.0.0.1 at a free port, in its own process group; killed when the object goes away.
class MotoServer {
 public:
  // Starts it and waits (at most 60 s) until it answers HTTP; tries another port if it exits at once (the port was
  // taken meanwhile). Unavailable if it keeps exiting, DeadlineExceeded if it never answers, FailedPrecondition if
  // moto_server is not installed.
  static StatusOr<std::unique_ptr<MotoServer>> Start();
  ~MotoServer();
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  // "http://127.0.0.1:PORT"
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  // Creates a bucket (PUT /bucket, unsigned: moto does not check signatures). Unavailable on failure.
  Status CreateBucket(const std::string& bucket) const;
  // Kills the server now (the outage test); the destructor then has nothing left to do.
  void Kill();

 private:
  static StatusOr<std::unique_ptr<MotoServer>> StartOnce();
  MotoServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

// One moto_server for the whole test process (CTest runs each test in its own process): started by the first call,
// killed at exit. A failed start is remembered: every call returns its error. Environment variables set before the
// first call reach the server. Thread-safe.
StatusOr<MotoServer*> SharedMotoServer();

}  // namespace parsyn::storage
