#include "cli/progress_bar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace parsyn::cli {
namespace {

TEST(ProgressBarTest, FormatsStepsLossRateAndEta) {
  EXPECT_EQ(FormatProgressLine(45, 100, 1.23456, 2e-4, 1234.0, "tokens/s", 42, 20),
            "[#########-----------]  45/100  loss 1.2346  lr 2.00e-04  1.2k tokens/s  ETA 0:42");
  EXPECT_EQ(FormatProgressLine(3, 3, 0.5, 1e-3, 12.0, "samples/s", 0, 4),
            "[####] 3/3  loss 0.5000  lr 1.00e-03  12.0 samples/s  ETA 0:00");
  EXPECT_EQ(FormatProgressLine(1, 10, 2, 1e-3, 2.5e6, "tokens/s", -1, 4),
            "[----]  1/10  loss 2.0000  lr 1.00e-03  2.5M tokens/s  ETA --");
  EXPECT_NE(FormatProgressLine(1, 100000, 2, 1e-3, 1, "tokens/s", 3725, 4).find("ETA 1:02:05"), std::string::npos);
  // Unknown parts are left out rather than shown as zeros.
  EXPECT_EQ(FormatProgressLine(2, 4, 0.25, std::nan(""), std::nan(""), "samples/s", -1, 4),
            "[##--] 2/4  loss 0.2500  ETA --");
  EXPECT_EQ(FormatProgressLine(2, 4, 0.25, std::nan(""), 1500, "samples/s", -1, 4),
            "[##--] 2/4  loss 0.2500  1.5k samples/s  ETA --");
  // A rate whose unit is not known (a worker that does not say it) is left out, never shown as a bare "/s".
  EXPECT_EQ(FormatProgressLine(2, 4, 0.25, std::nan(""), 1500, "", -1, 4), "[##--] 2/4  loss 0.2500  ETA --");
}

// The ETA (job watch's per worker, train's bar) is measured from the first step seen, not from before it.
TEST(ProgressBarTest, StepPaceEstimatesOnceTwoStepsMeasureAPace) {
  StepPace pace;
  const auto t0 = StepPace::Clock::time_point{} + std::chrono::seconds(100);
  EXPECT_LT(pace.EtaSeconds(5, 105, t0), 0);                                         // one report: no pace yet
  EXPECT_LT(pace.EtaSeconds(5, 105, t0 + std::chrono::seconds(3)), 0);               // the same step again
  EXPECT_DOUBLE_EQ(pace.EtaSeconds(15, 105, t0 + std::chrono::seconds(20)), 180.0);  // 2 s a step, 90 left
  EXPECT_DOUBLE_EQ(pace.EtaSeconds(105, 105, t0 + std::chrono::seconds(200)), 0.0);
  EXPECT_LT(pace.EtaSeconds(1, 50, t0 + std::chrono::seconds(300)), 0);  // a new task starts over
  EXPECT_DOUBLE_EQ(pace.EtaSeconds(11, 50, t0 + std::chrono::seconds(310)), 39.0);
  EXPECT_EQ(FormatProgressLine(11, 50, 1, std::nan(""), 4.0, "samples/s", 39.0, 4),
            "[----] 11/50  loss 1.0000  4.0 samples/s  ETA 0:39");
}

TEST(ProgressBarTest, RoundedNumberKeepsFourDecimals) {
  EXPECT_EQ(RoundedNumber(5.363856935501099), "5.3639");
  EXPECT_EQ(RoundedNumber(0.5), "0.5000");
  EXPECT_EQ(RoundedNumber(1.23456789, 2), "1.23");
  EXPECT_EQ(RoundedNumber(3), "3");  // integers as they are
  EXPECT_EQ(RoundedNumber(nullptr), "null");
  EXPECT_EQ(RoundedNumber("n/a"), "n/a");
}

TEST(ProgressBarTest, NonInteractiveOutputPrintsAboutEveryTenthStep) {
  std::ostringstream out;
  ProgressReporter reporter(out, /*interactive=*/false);
  reporter.OnEvent({{"event", "start"},
                    {"kind", "tabular"},
                    {"num_samples", 80},
                    {"num_validation", 20},
                    {"total_steps", 100},
                    {"trainable_parameters", 10},
                    {"device", "cpu"}});
  for (int step = 1; step <= 100; ++step) {
    reporter.OnEvent({{"event", "progress"},
                      {"step", step},
                      {"total_steps", 100},
                      {"loss", 1.0},
                      {"lr", 1e-3},
                      {"throughput", 100.0},
                      {"throughput_unit", "samples/s"}});
  }
  reporter.OnEvent({{"event", "eval"},
                    {"phase", "after"},
                    {"loss", 0.5},
                    {"perplexity", 1.65},
                    {"accuracy", 0.9},
                    {"exact_match", 0.9},
                    {"num_examples", 20}});
  const std::string text = out.str();
  EXPECT_NE(text.find("80 training examples, 20 for validation, 100 steps"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '['), 11) << text;  // step 1, then every 10th
  EXPECT_NE(text.find("validation after training: loss 0.5000"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

TEST(ProgressBarTest, InteractiveOutputRedrawsOneLine) {
  std::ostringstream out;
  ProgressReporter reporter(out, /*interactive=*/true);
  for (int step = 1; step <= 3; ++step) {
    reporter.OnEvent({{"event", "progress"},
                      {"step", step},
                      {"total_steps", 3},
                      {"loss", 1.0},
                      {"lr", 1e-3},
                      {"throughput", 500.0},
                      {"throughput_unit", "tokens/s"}});
  }
  reporter.Finish();
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 3);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_NE(text.find("tokens/s"), std::string::npos);
}

// Upload and download bars: bytes with their unit, the rate per second, the ETA once a rate is measured.
TEST(ProgressBarTest, TransferLinesShowBytesRateAndEta) {
  EXPECT_EQ(FormatTransferLine("model.safetensors", 12'300'000, 49'200'000, 3.4e6, 8),
            "[##------]  12.3 MB/49.2 MB  3.4 MB/s  ETA 0:11  model.safetensors");
  EXPECT_EQ(FormatTransferLine("train.jsonl", 0, 2048, std::nan(""), 4), "[----]  0 B/2.0 kB  train.jsonl");
  EXPECT_EQ(FormatTransferLine("x", 2'500'000'000, 2'500'000'000, 5e8, 4),
            "[####]  2.50 GB/2.50 GB  500.0 MB/s  ETA 0:00  x");
  // No total (an artifact the list did not size): bytes and rate only.
  EXPECT_EQ(FormatTransferLine("best/adapter", 512, 0, 1024, 4), "[----]  512 B  1.0 kB/s  best/adapter");

  std::ostringstream quiet;
  {
    TransferProgress progress(quiet, /*enabled=*/false, "f", 10);
    progress.Update(5);
    progress.Finish();
  }
  EXPECT_EQ(quiet.str(), "");  // not a terminal and not forced: nothing at all
  std::ostringstream shown;
  TransferProgress progress(shown, /*enabled=*/true, "f", 10);
  progress.Update(10);
  progress.Finish();
  EXPECT_NE(shown.str().find("[########################]  10 B/10 B"), std::string::npos) << shown.str();
  EXPECT_EQ(shown.str().back(), '\n');
}

}  // namespace
}  // namespace parsyn::cli
