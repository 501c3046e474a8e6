#include "simulation/worker_speeds.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numbers>

#include "strategy/seed.h"

namespace parsyn::simulation {
namespace {

constexpr std::string_view kLognormal = "lognormal:";

// A uniform double in (0, 1] from 64 random bits.
double Uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1) * 0x1.0p-53; }

// A standard normal for worker `index` (Box-Muller over two draws of the seed's stream).
double StandardNormal(uint64_t seed, uint64_t index) {
  const uint64_t a = strategy::Mix64(strategy::Mix64(seed ^ 0x5350454544ULL) + 2 * index);
  const uint64_t b = strategy::Mix64(strategy::Mix64(seed ^ 0x5350454544ULL) + 2 * index + 1);
  return std::sqrt(-2 * std::log(Uniform(a))) * std::cos(2 * std::numbers::pi * Uniform(b));
}

StatusOr<double> ParsePositive(std::string_view text, const std::string& where) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value <= 0) {
    return InvalidArgumentError(where + ": '" + std::string(text) + "' is not a positive number of seconds");
  }
  return value;
}

StatusOr<std::vector<double>> ReadSpeedsFile(const std::string& path, int workers) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgumentError("--speeds " + path +
                                ": no such file (give lognormal:SIGMA, or a file with one step time in seconds per "
                                "worker)");
  }
  std::vector<double> speeds;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t\r");
    PARSYN_ASSIGN_OR_RETURN(const double seconds, ParsePositive(std::string_view(line).substr(first, last - first + 1),
                                                                path + " line " + std::to_string(number)));
    speeds.push_back(seconds);
  }
  if (speeds.size() != static_cast<size_t>(workers)) {
    return InvalidArgumentError("--speeds " + path + " gives " + std::to_string(speeds.size()) +
                                " step times; it needs one per virtual worker (" + std::to_string(workers) + ")");
  }
  return speeds;
}

}  // namespace

StatusOr<std::vector<double>> ParseWorkerSpeeds(const std::string& spec, int workers, uint64_t seed) {
  if (!spec.starts_with(kLognormal)) return ReadSpeedsFile(spec, workers);
  const std::string sigma_text = spec.substr(kLognormal.size());
  double sigma = -1;
  const auto [end, ec] = std::from_chars(sigma_text.data(), sigma_text.data() + sigma_text.size(), sigma);
  if (ec != std::errc() || end != sigma_text.data() + sigma_text.size() || !std::isfinite(sigma) || sigma < 0 ||
      sigma > 10) {
    return InvalidArgumentError("--speeds " + spec + ": SIGMA must be a number in [0, 10], e.g. lognormal:1");
  }
  std::vector<double> speeds(static_cast<size_t>(std::max(workers, 0)));
  for (size_t i = 0; i < speeds.size(); ++i) speeds[i] = std::exp(sigma * StandardNormal(seed, i));
  return speeds;
}

StatusOr<std::vector<double>> VirtualEnds(const std::vector<std::vector<int64_t>>& attempts,
                                          const std::map<int64_t, double>& step_seconds, int64_t steps_per_round) {
  std::vector<double> ends;
  double now = 0;
  for (const std::vector<int64_t>& participants : attempts) {
    double slowest = 0;
    for (int64_t worker : participants) {
      const auto it = step_seconds.find(worker);
      if (it == step_seconds.end()) {
        return InvalidArgumentError("worker " + std::to_string(worker) + " has no step time");
      }
      slowest = std::max(slowest, it->second);
    }
    now += static_cast<double>(steps_per_round) * slowest;
    ends.push_back(now);
  }
  return ends;
}

double VirtualSchedule::Start(int64_t worker) {
  auto speed = step_seconds_.find(worker);
  const double end = now_ + static_cast<double>(steps_per_task_) * (speed == step_seconds_.end() ? 0.0 : speed->second);
  training_[worker] = end;
  return end;
}

void VirtualSchedule::Finished(int64_t worker) {
  auto it = training_.find(worker);
  if (it == training_.end()) return;
  held_.insert({it->second, worker});
  training_.erase(it);
}

std::optional<int64_t> VirtualSchedule::Release() {
  if (held_.empty()) return std::nullopt;
  const auto [end, worker] = *held_.begin();
  for (const auto& [other, other_end] : training_) {
    if (other_end < end || (other_end == end && other < worker)) return std::nullopt;  // it reports first
  }
  held_.erase(held_.begin());
  now_ = std::max(now_, end);
  return worker;
}

}  // namespace parsyn::simulation
