#include "worker/telemetry.h"
#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

namespace parsyn::worker {
namespace {

TEST(ParseProcStatCpuLineTest, CountsIdleAndIowaitAsNotBusy) {
  std::optional<CpuTimes> t = ParseProcStatCpuLine("cpu  100 5 50 800 20 3 2 0 0 0");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->total, 980u);
  EXPECT_EQ(t->busy, 160u);
}

TEST(ParseProcStatCpuLineTest, RejectsOtherLines) {
  EXPECT_FALSE(ParseProcStatCpuLine("cpu0 1 2 3 4").has_value());
  EXPECT_FALSE(ParseProcStatCpuLine("cpu 1 2").has_value());
  EXPECT_FALSE(ParseProcStatCpuLine("").has_value());
}

TEST(UtilizationSamplerTest, CpuSamplesAreFractionsAfterTheFirst) {
  UtilizationSampler sampler("cpu");
  EXPECT_STREQ(sampler.source(), "cpu");
  EXPECT_EQ(sampler.device_kind(), "host_cpu");  // the whole machine's CPU, as progress reports name it
  EXPECT_FALSE(sampler.Sample().has_value());    // the baseline
  // Burn a little CPU so the kernel's counters move.
  volatile double x = 0;
  std::optional<double> u;
  for (int i = 0; i < 200 && !u; ++i) {
    for (int j = 0; j < 200'000; ++j) x = x + j;
    u = sampler.Sample();
  }
  ASSERT_TRUE(u.has_value());
  EXPECT_GE(*u, 0.0);
  EXPECT_LE(*u, 1.0);
}

// The stand-in NVML (testing/stand_in_nvml.c) in the real library's place: the sampler reports the GPU's utilisation
// and memory as the library answers them, for the device the task runs on.
TEST(UtilizationSamplerTest, GpuTasksAreMeasuredThroughNvml) {
  setenv("PARSYN_NVML_LIBRARY", test_support::BuildPath("stand-in-nvml").c_str(), 1);
  setenv("PARSYN_STAND_IN_NVML_UTILIZATION", "73", 1);
  setenv("PARSYN_STAND_IN_NVML_MEMORY_USED", "12884901888", 1);
  setenv("PARSYN_STAND_IN_NVML_MEMORY_TOTAL", "85899345920", 1);
  setenv("PARSYN_STAND_IN_NVML_DEVICES", "2", 1);
  UtilizationSampler gpu("cuda:1");
  EXPECT_STREQ(gpu.source(), "nvml");
  EXPECT_EQ(gpu.device_kind(), "gpu");
  EXPECT_EQ(gpu.Sample(), 0.73);
  ASSERT_TRUE(gpu.Memory().has_value());
  EXPECT_EQ(gpu.Memory()->used_bytes, 12884901888u);
  EXPECT_EQ(gpu.Memory()->total_bytes, 85899345920u);
  UtilizationSampler missing("cuda:2");  // no such device: the CPU is measured
  EXPECT_STREQ(missing.source(), "cpu");
  UtilizationSampler cpu("cpu");  // a CPU task never asks NVML
  EXPECT_FALSE(cpu.Memory().has_value());
  unsetenv("PARSYN_NVML_LIBRARY");
}

TEST(UtilizationSamplerTest, CudaWithoutNvmlFallsBackToCpu) {
  UtilizationSampler sampler("cuda:0");
  // On machines without the NVIDIA driver, dlopen fails and the sampler measures the CPU.
  if (std::string(sampler.source()) == "nvml") GTEST_SKIP() << "NVML present";
  EXPECT_STREQ(sampler.source(), "cpu");
}

}  // namespace
}  // namespace parsyn::worker
