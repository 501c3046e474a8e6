// Test support for the multi-process tests (tests/coordinator, tests/e2e): waiting on a training job's event stream,
// GET /api/v1/training-jobs/<id>/events?after=0, which replays every one of the job's events (worker progress
// included) from the start and then follows it.
//
// Contract: every wait ends by `timeout` at the latest and returns what it saw; none fails the test by itself. What
// happens when the stream ends (the job is over, the server went away) before the awaited event is the caller's
// choice: kGiveUp returns false at once; kReconnect reads the stream again (after 200 ms when it ended with an error,
// e.g. during a server restart) until the deadline. Called from one thread; `admin` is not shared meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "http/client.h"

namespace parsyn::test_support {

// Sees each event: its type (the SSE event name) and its data (JSON; discarded when it does not parse).
using JobEventPredicate = std::function<bool(const std::string& type, const nlohmann::json& data)>;

enum class OnStreamEnd { kGiveUp, kReconnect };

// Whether an event of job `job_id` satisfied `pred` before `timeout`.
inline bool WaitForJobEvent(http::Client& admin, int64_t job_id, const JobEventPredicate& pred,
                            std::chrono::milliseconds timeout, OnStreamEnd on_end) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool found = false;
  do {
    http::CallOptions call;
    call.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    Status read = admin.ReadEvents(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/events?after=0",
        [&](const http::SseEvent& e) {
          if (pred(e.event, nlohmann::json::parse(e.data, nullptr, false))) found = true;
          return !found;
        },
        call);
    if (found) break;
    // Said, so a test that then fails shows whether the stream ended cleanly or was cut (and how).
    std::fprintf(stderr, "[job events] job %lld: the stream ended before the awaited event: %s\n",
                 static_cast<long long>(job_id), read.ok() ? "cleanly" : read.ToString().c_str());
    if (on_end == OnStreamEnd::kGiveUp) break;
    // The server is away (restarting, say): no stream to wait on until it is back.
    if (!read.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < deadline);
  return found;
}

// Waits until job `job_id` has a terminal status (neither queued nor running) or `timeout` passes, then returns the
// job's JSON (GET /api/v1/training-jobs/<id>), or null JSON when that fails.
inline nlohmann::json WaitForJobEnd(http::Client& admin, int64_t job_id, std::chrono::milliseconds timeout,
                                    OnStreamEnd on_end) {
  WaitForJobEvent(
      admin, job_id,
      [](const std::string& type, const nlohmann::json& data) {
        if (type != "job_status") return false;
        const std::string status = data.value("status", "");
        return status != "queued" && status != "running";
      },
      timeout, on_end);
  StatusOr<http::ClientResponse> job = admin.Get("/api/v1/training-jobs/" + std::to_string(job_id));
  return job.ok() ? *job->Json() : nlohmann::json();
}

}  // namespace parsyn::test_support
