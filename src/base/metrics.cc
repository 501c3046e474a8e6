#include "base/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace parsyn::metrics {

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;  // few buckets: a scan beats a binary search
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // Read from the buckets so that +Inf and _count agree even while observations land.
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& DurationBuckets() {
  static const std::vector<double> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1,     2.5,    5,     10,   30,    60,   120, 300};
  return bounds;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);  // the shortest text that reads back exactly
  return std::string(buf, end);
}

namespace {

// `{a="x",b="y"}` (with `extra` appended, e.g. le="0.5"), or "" when there are no labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     std::string_view extra = {}) {
  if (names.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  return out + "}";
}

void RenderSeries(const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Counter& c, const std::vector<double>&,
                  std::string& out) {
  out += name + LabelSet(names, values) + " " + FormatValue(c.value()) + "\n";
}

void RenderSeries(const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Gauge& g, const std::vector<double>&,
                  std::string& out) {
  out += name + LabelSet(names, values) + " " + FormatValue(g.value()) + "\n";
}

void RenderSeries(const std::string& name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, const Histogram& h, const std::vector<double>& bounds,
                  std::string& out) {
  Histogram::Snapshot s = h.Read();
  for (size_t i = 0; i <= bounds.size(); ++i) {
    const std::string le = "le=\"" + (i < bounds.size() ? FormatValue(bounds[i]) : std::string("+Inf")) + "\"";
    out += name + "_bucket" + LabelSet(names, values, le) + " " + std::to_string(s.cumulative[i]) + "\n";
  }
  out += name + "_sum" + LabelSet(names, values) + " " + FormatValue(s.sum) + "\n";
  out += name + "_count" + LabelSet(names, values) + " " + std::to_string(s.count) + "\n";
}

}  // namespace

template <typename Series>
Series& Family<Series>::WithLabels(std::initializer_list<std::string_view> values) {
  std::vector<std::string> key;
  key.reserve(values.size());
  for (std::string_view v : values) key.emplace_back(v);
  return WithLabels(key);
}

template <typename Series>
Series& Family<Series>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != labels_.size()) {
    throw std::invalid_argument("metric " + name_ + " takes " + std::to_string(labels_.size()) + " label values, got " +
                                std::to_string(values.size()));
  }
  std::lock_guard lock(mu_);
  std::unique_ptr<Series>& series = series_[values];
  if (!series) {
    if constexpr (std::is_same_v<Series, metrics::Histogram>) {
      series = std::make_unique<Series>(bounds_);
    } else {
      series = std::make_unique<Series>();
    }
  }
  return *series;
}

template <typename Series>
void Family<Series>::Clear() {
  std::lock_guard lock(mu_);
  series_.clear();
}

template <typename Series>
void Family<Series>::Render(std::string_view type, std::string& out) const {
  out += "# HELP " + name_ + " " + EscapeHelp(help_) + "\n";
  out += "# TYPE " + name_ + " " + std::string(type) + "\n";
  std::lock_guard lock(mu_);
  for (const auto& [values, series] : series_) RenderSeries(name_, labels_, values, *series, bounds_, out);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Registry::Entry* Registry::Find(const std::string& name) {
  for (auto& e : entries_) {
    const std::string& n = e->counter ? e->counter->name_ : e->gauge ? e->gauge->name_ : e->histogram->name_;
    if (n == name) return e.get();
  }
  return nullptr;
}

CounterFamily& Registry::Counter(std::string name, std::string help, std::vector<std::string> labels) {
  std::lock_guard lock(mu_);
  if (Entry* e = Find(name); e != nullptr && e->counter) return *e->counter;
  auto e = std::make_unique<Entry>();
  e->type = "counter";
  e->counter.reset(new CounterFamily(std::move(name), std::move(help), std::move(labels)));
  entries_.push_back(std::move(e));
  return *entries_.back()->counter;
}

GaugeFamily& Registry::Gauge(std::string name, std::string help, std::vector<std::string> labels) {
  std::lock_guard lock(mu_);
  if (Entry* e = Find(name); e != nullptr && e->gauge) return *e->gauge;
  auto e = std::make_unique<Entry>();
  e->type = "gauge";
  e->gauge.reset(new GaugeFamily(std::move(name), std::move(help), std::move(labels)));
  entries_.push_back(std::move(e));
  return *entries_.back()->gauge;
}

HistogramFamily& Registry::Histogram(std::string name, std::string help, std::vector<std::string> labels,
                                     std::vector<double> bounds) {
  std::lock_guard lock(mu_);
  if (Entry* e = Find(name); e != nullptr && e->histogram) return *e->histogram;
  auto e = std::make_unique<Entry>();
  e->type = "histogram";
  e->histogram.reset(new HistogramFamily(std::move(name), std::move(help), std::move(labels), std::move(bounds)));
  entries_.push_back(std::move(e));
  return *entries_.back()->histogram;
}

std::string Registry::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& e : entries_) {
    if (e->counter) e->counter->Render(e->type, out);
    if (e->gauge) e->gauge->Render(e->type, out);
    if (e->histogram) e->histogram->Render(e->type, out);
  }
  return out;
}

Registry& DefaultRegistry() {
  static Registry* registry = new Registry();  // never destroyed: metrics may be touched during exit
  return *registry;
}

std::string RenderProcessMetrics() {
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, double value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
           FormatValue(value) + "\n";
  };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name, which sits in parentheses and may itself hold spaces and parentheses.
  size_t close = stat.rfind(')');
  if (close == std::string::npos || ticks <= 0) return out;
  std::istringstream fields(stat.substr(close + 2));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  for (std::string word; fields >> word;) f.push_back(word);
  if (f.size() < 22) return out;
  const double utime = std::stod(f[11]), stime = std::stod(f[12]);  // fields 14 and 15
  const double start_ticks = std::stod(f[19]);                      // field 22: since boot
  const double vsize = std::stod(f[20]), rss_pages = std::stod(f[21]);
  double boot_time = 0;
  std::ifstream proc_stat("/proc/stat");
  for (std::string line; std::getline(proc_stat, line);) {
    if (line.rfind("btime ", 0) == 0) boot_time = std::stod(line.substr(6));
  }
  size_t open_fds = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++open_fds;
  }
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  metric("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
         (utime + stime) / ticks);
  metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss_pages * page);
  metric("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize);
  metric("process_open_fds", "gauge", "Number of open file descriptors.", static_cast<double>(open_fds));
  metric("process_max_fds", "gauge", "Maximum number of open file descriptors.",
         limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<double>(limit.rlim_cur));
  metric("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
         boot_time + start_ticks / ticks);
  return out;
}

}  // namespace parsyn::metrics
