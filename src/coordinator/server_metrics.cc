#include "coordinator/server_metrics.h"

#include <string>

#include "base/log.h"

namespace parsyn::coordinator {

namespace {

// Sizes in bytes, for nothing yet; durations use metrics::DurationBuckets().
ServerMetrics* MakeMetrics() {
  metrics::Registry& r = metrics::DefaultRegistry();
  return new ServerMetrics{
      .jobs = r.Gauge("parsyn_jobs", "Training jobs in the metadata store, by status.", {"status"}),
      .rounds = r.Counter("parsyn_rounds_total",
                          "Round attempts that ended since the server started: committed or failed.", {"outcome"}),
      .round_duration = r.Histogram("parsyn_round_duration_seconds",
                                    "Time from the start of a round attempt to its commit (committed rounds only)."),
      .phase_duration = r.Histogram("parsyn_round_phase_duration_seconds",
                                    "Time spent in each phase of a round's work on the coordinator.", {"phase"}),
      .updates_accepted =
          r.Counter("parsyn_updates_accepted_total", "Worker updates accepted into a round's aggregate."),
      .updates_rejected = r.Counter("parsyn_updates_rejected_total",
                                    "Worker updates rejected, by reason category (invalid_file: the upload failed "
                                    "its checks; strategy: the strategy refused it; report: the result report was "
                                    "refused; error: the coordinator could not check it).",
                                    {"reason"}),
      .bytes_received =
          r.Counter("parsyn_http_request_body_bytes_total", "Request body bytes the HTTP server received."),
      .bytes_sent = r.Counter("parsyn_http_response_body_bytes_total",
                              "Response body bytes the HTTP server sent (event streams not counted)."),
      .job_blob_bytes = r.Counter("parsyn_job_blob_bytes_total",
                                  "Bytes of jobs' blobs (globals, their zstd copies and deltas, shards, "
                                  "updates) that crossed the wire through the coordinator, or straight to the blob "
                                  "store for updates: down to workers, up from them. The sum of the rounds' "
                                  "bytes_down and bytes_up.",
                                  {"direction"}),
      .workers_connected = r.Gauge("parsyn_workers_connected",
                                   "Workers with a session (said hello, heartbeating), by kind (own, managed) and "
                                   "status (online: idle; busy: holding a task).",
                                   {"kind", "status"}),
      .heartbeat_age_max = r.Gauge("parsyn_worker_heartbeat_age_max_seconds",
                                   "Longest time since a connected worker was last heard from (0 with none)."),
      .heartbeat_age_median = r.Gauge("parsyn_worker_heartbeat_age_median_seconds",
                                      "Median time since connected workers were last heard from (0 with none)."),
      .http_requests =
          r.Counter("parsyn_http_requests_total", "HTTP requests answered, by method, route pattern and status code.",
                    {"method", "route", "status"}),
      .http_duration = r.Histogram("parsyn_http_request_duration_seconds",
                                   "Time to answer an HTTP request (until the response is ready to send), by "
                                   "method and route pattern.",
                                   {"method", "route"}),
      .store_duration = r.Histogram("parsyn_store_operation_duration_seconds",
                                    "Latency of metadata store operations, by operation.", {"operation"}),
      .store_errors = r.Counter("parsyn_store_operation_errors_total",
                                "Metadata store operations that returned an error, by operation.", {"operation"}),
      .loop_lag = r.Histogram("parsyn_event_loop_lag_seconds",
                              "How long a handler posted to the event loop waits behind the work already queued "
                              "there (measured every 100 ms): the wait a request read then also has."),
      .tick_lateness = r.Histogram("parsyn_timer_tick_lateness_seconds",
                                   "How late the event loop's 100 ms timer tick ran, which timeouts (aggregation, "
                                   "heartbeat, long-poll) share."),
  };
}

}  // namespace

ServerMetrics& Metrics() {
  static ServerMetrics* metrics = MakeMetrics();  // never destroyed, like the registry
  return *metrics;
}

void ObservePhase(std::string_view phase, double milliseconds) {
  Metrics().phase_duration.WithLabels({phase}).Observe(milliseconds / 1000);
}

std::string_view RouteLabel(const http::Request& req) {
  // Both arms string_view: with a char array and a std::string the result would be a temporary string.
  return req.route.empty() ? std::string_view("unmatched") : std::string_view(req.route);
}

void RecordRequest(const http::RequestRecord& record) {
  ServerMetrics& m = Metrics();
  const http::Request& req = record.request;
  const std::string_view method = http::MethodName(req.method);
  const std::string_view route = RouteLabel(req);
  const double seconds = std::chrono::duration<double>(record.duration).count();
  m.http_requests.WithLabels({method, route, std::to_string(record.status)}).Inc();
  m.http_duration.WithLabels({method, route}).Observe(seconds);
  m.bytes_received.WithLabels({}).Inc(static_cast<double>(record.bytes_received));
  m.bytes_sent.WithLabels({}).Inc(static_cast<double>(record.bytes_sent));
  // The route pattern, not the path or target: paths of signed blob URLs and query strings carry signatures.
  PARSYN_LOG_INFO("access: {} {} {} status={} duration_ms={:.1f} request_id={}{}{}", req.remote_address, method, route,
                  record.status, seconds * 1000, req.request_id, req.principal.empty() ? "" : " by=", req.principal);
}

std::string RenderMetrics() { return metrics::DefaultRegistry().Render() + metrics::RenderProcessMetrics(); }

}  // namespace parsyn::coordinator
