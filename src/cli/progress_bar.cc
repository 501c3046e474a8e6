#include "cli/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace parsyn::cli {
namespace {

using nlohmann::json;

std::string HumanRate(double rate) {
  char buffer[32];
  if (rate >= 1e6) {
    std::snprintf(buffer, sizeof buffer, "%.1fM", rate / 1e6);
  } else if (rate >= 1e3) {
    std::snprintf(buffer, sizeof buffer, "%.1fk", rate / 1e3);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1f", rate);
  }
  return buffer;
}

std::string Duration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "--";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buffer;
}

std::string MetricsText(const json& e) {
  char buffer[160];
  std::snprintf(buffer, sizeof buffer,
                "loss %.4f  perplexity %.3f  accuracy %.1f%%  exact match %.1f%%  (%lld examples)",
                e.value("loss", 0.0), e.value("perplexity", 0.0), 100 * e.value("accuracy", 0.0),
                100 * e.value("exact_match", 0.0), static_cast<long long>(e.value("num_examples", 0)));
  return buffer;
}

}  // namespace

std::string FormatProgressLine(int64_t step, int64_t total_steps, double loss, double learning_rate, double rate,
                               const std::string& rate_unit, double eta_seconds, int width) {
  const double fraction = total_steps > 0 ? std::clamp(static_cast<double>(step) / total_steps, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(std::floor(fraction * width));
  std::string bar =
      "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '-') + "]";
  const int digits = static_cast<int>(std::to_string(total_steps).size());
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, "%s %*lld/%lld  loss %.4f", bar.c_str(), digits, static_cast<long long>(step),
                static_cast<long long>(total_steps), loss);
  std::string line = buffer;
  if (!std::isnan(learning_rate)) {
    std::snprintf(buffer, sizeof buffer, "  lr %.2e", learning_rate);
    line += buffer;
  }
  if (!std::isnan(rate) && !rate_unit.empty()) line += "  " + HumanRate(rate) + " " + rate_unit;
  return line + "  ETA " + Duration(eta_seconds);
}

std::string RoundedNumber(const json& value, int decimals) {
  if (!value.is_number_float()) return value.is_string() ? value.get<std::string>() : value.dump();
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value.get<double>());
  return buffer;
}

double StepPace::EtaSeconds(int64_t step, int64_t total_steps, Clock::time_point now) {
  if (!started_ || step < first_step_) {
    started_ = true;
    first_step_ = step;
    first_seen_ = now;
  }
  const int64_t steps_measured = step - first_step_;
  if (steps_measured <= 0) return -1;
  const double elapsed = std::chrono::duration<double>(now - first_seen_).count();
  return elapsed / static_cast<double>(steps_measured) * static_cast<double>(std::max<int64_t>(total_steps - step, 0));
}

ProgressReporter::ProgressReporter(std::ostream& out, bool interactive) : out_(out), interactive_(interactive) {}

void ProgressReporter::Finish() {
  if (bar_open_) {
    out_ << "\n";
    out_.flush();
    bar_open_ = false;
  }
}

void ProgressReporter::OnEvent(const json& event) {
  const std::string kind = event.value("event", "");
  if (kind == "start") {
    out_ << "training " << event.value("kind", "") << " on " << event.value("device", "cpu") << ": "
         << event.value("num_samples", 0) << " training examples, " << event.value("num_validation", 0)
         << " for validation, " << event.value("total_steps", 0) << " steps, " << event.value("trainable_parameters", 0)
         << " trainable parameters\n";
  } else if (kind == "eval") {
    Finish();
    out_ << "validation " << event.value("phase", "") << " training: " << MetricsText(event) << "\n";
  } else if (kind == "progress") {
    const int64_t step = event.value("step", 0);
    const int64_t total = event.value("total_steps", 0);
    const double eta = pace_.EtaSeconds(step, total, std::chrono::steady_clock::now());
    const std::string line = FormatProgressLine(
        step, total, event.value("loss", 0.0), event.value("lr", 0.0), event.value("throughput", 0.0),
        event.value("throughput_unit", std::string("samples/s")), step == total ? 0 : eta);
    if (interactive_) {
      out_ << "\r" << line << "\033[K";
      bar_open_ = true;
      out_.flush();
    } else if (step == total || step == 1 || (step - last_printed_step_) * 10 >= total) {
      out_ << line << "\n";
      last_printed_step_ = step;
    }
  } else if (kind == "done") {
    Finish();
  }
}

namespace {

std::string Bytes(double bytes) {
  char buffer[32];
  if (bytes >= 1e9) {
    std::snprintf(buffer, sizeof buffer, "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buffer, sizeof buffer, "%.1f MB", bytes / 1e6);
  } else if (bytes >= 1e3) {
    std::snprintf(buffer, sizeof buffer, "%.1f kB", bytes / 1e3);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.0f B", bytes);
  }
  return buffer;
}

}  // namespace

std::string FormatTransferLine(const std::string& label, uint64_t bytes, uint64_t total_bytes, double bytes_per_second,
                               int width) {
  const double fraction =
      total_bytes > 0 ? std::clamp(static_cast<double>(bytes) / static_cast<double>(total_bytes), 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(std::floor(fraction * width));
  std::string line = "[" + std::string(static_cast<size_t>(filled), '#') +
                     std::string(static_cast<size_t>(width - filled), '-') + "]  " + Bytes(static_cast<double>(bytes));
  if (total_bytes > 0) line += "/" + Bytes(static_cast<double>(total_bytes));
  if (!std::isnan(bytes_per_second)) {
    line += "  " + Bytes(bytes_per_second) + "/s";
    if (total_bytes > 0 && bytes_per_second > 0) {
      line += "  ETA " + Duration(static_cast<double>(total_bytes - std::min(bytes, total_bytes)) / bytes_per_second);
    }
  }
  return line + "  " + label;
}

TransferProgress::TransferProgress(std::ostream& out, bool enabled, std::string label, uint64_t total_bytes)
    : out_(out), enabled_(enabled), label_(std::move(label)), total_(total_bytes) {}

void TransferProgress::Update(uint64_t bytes) {
  bytes_ = bytes;
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  if (open_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw();
}

void TransferProgress::Draw() {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = seconds > 0.05 ? static_cast<double>(bytes_) / seconds : std::nan("");
  out_ << "\r" << FormatTransferLine(label_, bytes_, total_, rate) << "\033[K" << std::flush;
  open_ = true;
}

void TransferProgress::Finish() {
  if (!enabled_) return;
  Draw();
  out_ << "\n" << std::flush;
  enabled_ = false;
}

}  // namespace parsyn::cli
