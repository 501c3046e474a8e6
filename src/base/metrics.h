// A small metrics registry rendered in the Prometheus text exposition format (version 0.0.4): counters, gauges and
// histograms with fixed buckets, each a family with a fixed list of label names. Label values must come from a
// bounded set (a route pattern, a status, a reason category — never a raw path, id or message), since every distinct
// value set is a series kept for the life of the process.
//
// Threads: everything is thread-safe. Updating a series is one or two relaxed atomic operations; finding a series by
// its label values takes the family's mutex, so hot paths may keep the returned reference (series are never freed
// while their family lives, except by Gauge families' Clear()).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace parsyn::metrics {

class Counter {
 public:
  void Inc(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }  // amount >= 0
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending (+Inf is implicit).
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative; the last is +Inf
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// Bucket bounds for durations in seconds: 1 ms to 5 min.
const std::vector<double>& DurationBuckets();

class Registry;

// Shared by the three family types: name, help, label names, the series by label values.
template <typename Series>
class Family {
 public:
  // The series for these label values (as many as the family's label names), created at first use.
  Series& WithLabels(std::initializer_list<std::string_view> values);
  Series& WithLabels(const std::vector<std::string>& values);
  // Drops every series (for gauges recomputed at each scrape, so a state no longer seen is not reported stale).
  void Clear();

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> labels, std::vector<double> bounds = {})
      : name_(std::move(name)), help_(std::move(help)), labels_(std::move(labels)), bounds_(std::move(bounds)) {}
  void Render(std::string_view type, std::string& out) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> labels_;
  const std::vector<double> bounds_;  // histograms only
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  // Adds a family; names follow Prometheus's rules ([a-zA-Z_:][a-zA-Z0-9_:]*; counters end in _total). Adding a
  // name twice returns the first family (same type expected) so independent callers may share one.
  CounterFamily& Counter(std::string name, std::string help, std::vector<std::string> labels = {});
  GaugeFamily& Gauge(std::string name, std::string help, std::vector<std::string> labels = {});
  HistogramFamily& Histogram(std::string name, std::string help, std::vector<std::string> labels = {},
                             std::vector<double> bounds = DurationBuckets());

  // Every family, in the order added, as text exposition format 0.0.4. Families with no series print only their
  // HELP and TYPE lines.
  std::string Render() const;

 private:
  struct Entry {
    std::string type;
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };
  Entry* Find(const std::string& name);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

// The process's registry, which the server's /metrics renders.
Registry& DefaultRegistry();

// A label value escaped for the exposition format: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);
// A HELP text escaped: backslash and newline.
std::string EscapeHelp(std::string_view text);
// A sample value as the format writes it: integers without a fraction, +Inf, -Inf, NaN.
std::string FormatValue(double value);

// The standard process metrics from /proc/self (Linux; nothing elsewhere): process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds, in exposition format.
std::string RenderProcessMetrics();

}  // namespace parsyn::metrics
