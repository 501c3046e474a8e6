// The coordinator's Prometheus metrics (docs/operations.md lists each one): the families in
// metrics::DefaultRegistry() that the service, its job runners and its HTTP server update, and the text GET /metrics
// answers. Label values are bounded: route patterns, statuses, phases, reason categories; never ids or paths.
#pragma once

#include <chrono>
#include <string_view>

#include "base/metrics.h"
#include "http/server.h"

namespace parsyn::coordinator {

struct ServerMetrics {
  metrics::GaugeFamily& jobs;                  // parsyn_jobs{status}
  metrics::CounterFamily& rounds;              // parsyn_rounds_total{outcome}
  metrics::HistogramFamily& round_duration;    // parsyn_round_duration_seconds
  metrics::HistogramFamily& phase_duration;    // parsyn_round_phase_duration_seconds{phase}
  metrics::CounterFamily& updates_accepted;    // parsyn_updates_accepted_total
  metrics::CounterFamily& updates_rejected;    // parsyn_updates_rejected_total{reason}
  metrics::CounterFamily& bytes_received;      // parsyn_http_request_body_bytes_total
  metrics::CounterFamily& bytes_sent;          // parsyn_http_response_body_bytes_total
  metrics::CounterFamily& job_blob_bytes;      // parsyn_job_blob_bytes_total{direction}
  metrics::GaugeFamily& workers_connected;     // parsyn_workers_connected{kind,status}
  metrics::GaugeFamily& heartbeat_age_max;     // parsyn_worker_heartbeat_age_max_seconds
  metrics::GaugeFamily& heartbeat_age_median;  // parsyn_worker_heartbeat_age_median_seconds
  metrics::CounterFamily& http_requests;       // parsyn_http_requests_total{method,route,status}
  metrics::HistogramFamily& http_duration;     // parsyn_http_request_duration_seconds{method,route}
  metrics::HistogramFamily& store_duration;    // parsyn_store_operation_duration_seconds{operation}
  metrics::CounterFamily& store_errors;        // parsyn_store_operation_errors_total{operation}
  metrics::HistogramFamily& loop_lag;          // parsyn_event_loop_lag_seconds
  metrics::HistogramFamily& tick_lateness;     // parsyn_timer_tick_lateness_seconds
};

// The families, registered in the default registry at first use.
ServerMetrics& Metrics();

// Records a phase of a round (a duration in milliseconds, as the runner's debug timings measure them).
void ObservePhase(std::string_view phase, double milliseconds);

// The route label of a request: its pattern, or "unmatched" when no route matched (never the raw path).
std::string_view RouteLabel(const http::Request& req);

// ServerOptions::on_request for `parsyn server`: counts the request by route and status, times it, adds its bytes,
// and writes the access log line at info level (method, route, status, duration, and who when known — never the
// query string, a token or a signature).
void RecordRequest(const http::RequestRecord& record);

// The whole exposition: every family of the default registry, then the process metrics.
std::string RenderMetrics();

}  // namespace parsyn::coordinator
