#include "simulation/round_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/atomic_file.h"
#include "base/strings.h"
#include "coordinator/job_spec.h"
#include "simulation/worker_speeds.h"
#include "strategy/strategy_options.h"

namespace parsyn::simulation {

using nlohmann::json;

StatusOr<RoundReport> ReadRoundReport(storage::MetadataStore& store, int64_t job_id, int workers,
                                      const std::map<int64_t, double>& step_seconds,
                                      const std::map<std::pair<int, int>, double>& measured_ends) {
  PARSYN_ASSIGN_OR_RETURN(storage::TrainingJob job, store.GetJob(job_id));
  RoundReport report{.job_id = job_id,
                     .job_status = std::string(storage::ToString(job.status)),
                     .failure_reason = job.failure_reason,
                     .workers = workers,
                     .initial_validation_loss = job.initial_validation_loss,
                     .final_validation_loss = job.final_validation_loss};
  if (job.best_round) report.best_round = *job.best_round;
  int64_t steps_per_round = 0;
  if (StatusOr<coordinator::JobSpec> spec = coordinator::ParseJobSpec(job.spec_json); spec.ok()) {
    report.strategy = std::string(strategy::StrategyKindName(spec->distributed.strategy));
    steps_per_round = spec->distributed.steps_per_round;
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Round> rounds, store.ListRounds(job_id));
  std::sort(rounds.begin(), rounds.end(), [](const storage::Round& a, const storage::Round& b) {
    return std::pair(a.round, a.attempt) < std::pair(b.round, b.attempt);
  });
  for (const storage::Round& r : rounds) {
    PARSYN_ASSIGN_OR_RETURN(std::vector<storage::RoundUpdate> updates, store.ListUpdates(job_id, r.round, r.attempt));
    RoundRow row{.round = r.round,
                 .attempt = r.attempt,
                 .status = std::string(storage::ToString(r.status)),
                 .participants = static_cast<int>(r.participants.size()),
                 .train_loss = r.train_loss,
                 .validation_loss = r.validation_loss,
                 .bytes_moved = r.bytes_moved,
                 .bytes_down = r.bytes_down.value_or(0),
                 .bytes_up = r.bytes_up.value_or(0),
                 .duration_ms = r.ended_at_ms ? *r.ended_at_ms - r.started_at_ms : 0,
                 .global_sha256 = r.global_sha256,
                 .failure_reason = r.failure_reason};
    if (auto measured = measured_ends.find({r.round, r.attempt}); measured != measured_ends.end()) {
      row.virtual_time_s = measured->second;
    }
    for (const storage::RoundUpdate& u : updates) {
      if (u.status == storage::UpdateStatus::kAccepted) {
        row.accepted_updates++;
        row.samples += u.num_samples;
      } else {
        row.rejected_updates++;
      }
    }
    if (r.status == storage::RoundStatus::kCommitted && !r.global_sha256.empty()) {
      report.final_global_sha256 = r.global_sha256;
    }
    report.rows.push_back(std::move(row));
  }
  if (!step_seconds.empty()) {
    std::vector<std::vector<int64_t>> attempts;
    for (const storage::Round& r : rounds) attempts.push_back(r.participants);
    PARSYN_ASSIGN_OR_RETURN(std::vector<double> ends, VirtualEnds(attempts, step_seconds, steps_per_round));
    for (size_t i = 0; i < ends.size(); ++i) report.rows[i].virtual_time_s = ends[i];
  }
  return report;
}

namespace {

std::string Number(const std::optional<double>& v) { return v ? fmt::format("{:.17g}", *v) : std::string(); }

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

json Nullable(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

std::string RoundReportCsv(const RoundReport& report) {
  std::string out =
      "round,attempt,status,participants,accepted_updates,rejected_updates,samples,train_loss,validation_loss,"
      "bytes_moved,bytes_down,bytes_up,duration_ms,global_sha256,failure_reason,virtual_time_s\n";
  for (const RoundRow& r : report.rows) {
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.round, r.attempt, r.status,
                       r.participants, r.accepted_updates, r.rejected_updates, r.samples, Number(r.train_loss),
                       Number(r.validation_loss), r.bytes_moved, r.bytes_down, r.bytes_up, r.duration_ms,
                       r.global_sha256, CsvField(r.failure_reason), Number(r.virtual_time_s));
  }
  return out;
}

json RoundReportJson(const RoundReport& report) {
  json rounds = json::array();
  for (const RoundRow& r : report.rows) {
    rounds.push_back({{"round", r.round},
                      {"attempt", r.attempt},
                      {"status", r.status},
                      {"participants", r.participants},
                      {"accepted_updates", r.accepted_updates},
                      {"rejected_updates", r.rejected_updates},
                      {"samples", r.samples},
                      {"train_loss", Nullable(r.train_loss)},
                      {"validation_loss", Nullable(r.validation_loss)},
                      {"bytes_moved", r.bytes_moved},
                      {"bytes_down", r.bytes_down},
                      {"bytes_up", r.bytes_up},
                      {"duration_ms", r.duration_ms},
                      {"global_sha256", r.global_sha256},
                      {"failure_reason", r.failure_reason},
                      {"virtual_time_s", Nullable(r.virtual_time_s)}});
  }
  return {{"job_id", report.job_id},
          {"status", report.job_status},
          {"failure_reason", report.failure_reason},
          {"strategy", report.strategy},
          {"workers", report.workers},
          {"initial_validation_loss", Nullable(report.initial_validation_loss)},
          {"final_validation_loss", Nullable(report.final_validation_loss)},
          {"best_round", report.best_round ? json(*report.best_round) : json(nullptr)},
          {"final_global_sha256", report.final_global_sha256},
          {"rounds", std::move(rounds)}};
}

std::string RoundReportSvg(const RoundReport& report) {
  // The two series, as (round, loss) points of committed rounds; round 0 is the starting weights' validation loss.
  std::vector<std::pair<double, double>> train, validation;
  if (report.initial_validation_loss && std::isfinite(*report.initial_validation_loss)) {
    validation.emplace_back(0, *report.initial_validation_loss);
  }
  int last_round = 1;
  for (const RoundRow& r : report.rows) {
    if (r.status != "committed") continue;
    last_round = std::max(last_round, r.round);
    if (r.train_loss && std::isfinite(*r.train_loss)) train.emplace_back(r.round, *r.train_loss);
    if (r.validation_loss && std::isfinite(*r.validation_loss)) validation.emplace_back(r.round, *r.validation_loss);
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* series : {&train, &validation}) {
    for (const auto& [x, y] : *series) {
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
  constexpr double kWidth = 640, kHeight = 400, kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double round) { return kLeft + plot_w * round / last_round; };
  auto py = [&](double loss) { return kTop + plot_h * (hi - loss) / (hi - lo); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" font-size=\"14\">{3}</text>\n",
      kWidth, kHeight, kLeft,
      XmlEscape(
          fmt::format("job {} ({}, {} workers): loss per round", report.job_id, report.strategy, report.workers)));
  svg +=
      fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", kLeft, kTop, kTop + plot_h);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", kLeft, kTop + plot_h,
                     kLeft + plot_w);
  const int step = std::max(1, last_round / 10);
  for (int r = 0; r <= last_round; r += step) {
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(r), kTop + plot_h + 18, r);
  }
  for (int i = 0; i <= 4; ++i) {
    const double loss = lo + (hi - lo) * i / 4;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.4g}</text>\n", kLeft - 6, py(loss) + 4,
                       loss);
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">round</text>\n", kLeft + plot_w / 2,
                     kHeight - 10);
  auto polyline = [&](const std::vector<std::pair<double, double>>& series, const char* color) {
    if (series.empty()) return;
    std::string points;
    for (const auto& [x, y] : series) points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", color, points);
    for (const auto& [x, y] : series) {
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(x), py(y), color);
    }
  };
  polyline(train, "#1f77b4");
  polyline(validation, "#d62728");
  svg += fmt::format(
      "<text x=\"{0}\" y=\"{1}\" fill=\"#1f77b4\">training loss</text>\n"
      "<text x=\"{0}\" y=\"{2}\" fill=\"#d62728\">validation loss</text>\n</svg>\n",
      kWidth - kRight - 120, kTop + 12, kTop + 28);
  return svg;
}

Status WriteRoundReport(const RoundReport& report, const std::filesystem::path& dir) {
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(dir / "rounds.csv", RoundReportCsv(report)));
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(dir / "rounds.json", RoundReportJson(report).dump(2) + "\n"));
  return WriteFileAtomically(dir / "loss.svg", RoundReportSvg(report));
}

}  // namespace parsyn::simulation
