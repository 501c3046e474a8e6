#include "base/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace parsyn::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue(R"(a"b\c)"
                             "\n"),
            R"(a\"b\\c\n)");
  EXPECT_EQ(EscapeHelp("line\\one\nline \"two\""), R"(line\\one\nline "two")");
  Registry registry;
  registry.Counter("odd_total", "Help with\na newline.", {"route"}).WithLabels({"/x/\"{id}\"\\"}).Inc();
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP odd_total Help with\\na newline.\n# TYPE odd_total counter\n"));
  EXPECT_THAT(text, HasSubstr("odd_total{route=\"/x/\\\"{id}\\\"\\\\\"} 1\n"));
}

TEST(MetricsTest, FormatsValues) {
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
}

TEST(MetricsTest, CountersAndGaugesRenderPerLabelSet) {
  Registry registry;
  CounterFamily& rounds = registry.Counter("rounds_total", "Rounds.", {"outcome"});
  rounds.WithLabels({"committed"}).Inc();
  rounds.WithLabels({"committed"}).Inc(2);
  rounds.WithLabels({"failed"}).Inc();
  GaugeFamily& jobs = registry.Gauge("jobs", "Jobs.", {"status"});
  jobs.WithLabels({"running"}).Set(4);
  registry.Gauge("plain", "No labels.").WithLabels({}).Set(1.5);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("rounds_total{outcome=\"committed\"} 3\nrounds_total{outcome=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE jobs gauge\njobs{status=\"running\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("plain 1.5\n"));
  jobs.Clear();
  EXPECT_THAT(registry.Render(), Not(HasSubstr("jobs{")));
  EXPECT_THROW(rounds.WithLabels({"a", "b"}), std::invalid_argument);
  // Adding a family twice gives the first one back.
  EXPECT_EQ(&registry.Counter("rounds_total", "again", {"outcome"}), &rounds);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry registry;
  HistogramFamily& latency = registry.Histogram("latency_seconds", "Latency.", {"op"}, {0.1, 1, 10});
  Histogram& h = latency.WithLabels({"get"});
  for (double v : {0.05, 0.1, 0.5, 2.0, 50.0}) h.Observe(v);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE latency_seconds histogram\n"
                              "latency_seconds_bucket{op=\"get\",le=\"0.1\"} 2\n"
                              "latency_seconds_bucket{op=\"get\",le=\"1\"} 3\n"
                              "latency_seconds_bucket{op=\"get\",le=\"10\"} 4\n"
                              "latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 5\n"
                              "latency_seconds_sum{op=\"get\"} 52.65\n"
                              "latency_seconds_count{op=\"get\"} 5\n"));
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  Registry registry;
  CounterFamily& family = registry.Counter("hits_total", "Hits.", {"t"});
  Histogram& h = registry.Histogram("h_seconds", "H.").WithLabels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        family.WithLabels({"x"}).Inc();
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(family.WithLabels({"x"}).value(), 40000);
  EXPECT_EQ(h.Read().count, 40000u);
  EXPECT_EQ(h.Read().sum, 20000);
}

TEST(MetricsTest, ProcessMetricsComeFromProc) {
  std::string text = RenderProcessMetrics();
  for (const char* name : {"process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds ",
                           "process_max_fds ", "process_start_time_seconds "}) {
    EXPECT_THAT(text, HasSubstr(std::string("\n") + name)) << text;
  }
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
}

}  // namespace
}  // namespace parsyn::metrics
