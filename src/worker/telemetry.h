// Utilisation for the worker's progress reports: the GPU's (NVML, loaded at run time with
// dlopen("libnvidia-ml.so.1"), or the library $PARSYN_NVML_LIBRARY names, so the agent builds and runs on machines
// without NVIDIA drivers) when the task runs on CUDA and NVML answers, else the whole machine's CPU busy fraction from
// /proc/stat between two samples. With NVML, also the GPU's memory in use and in all.
//
// Threads: one UtilizationSampler is used from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace parsyn::worker {

// "/proc/stat"'s first line as busy and total jiffies; nullopt when it cannot be read or parsed.
struct CpuTimes {
  uint64_t busy = 0;
  uint64_t total = 0;
};
std::optional<CpuTimes> ParseProcStatCpuLine(const std::string& line);

// The memory of the device a worker trains on, in bytes, as its hello announces it: the GPU's total (NVML) for
// "cuda"/"cuda:N" when NVML answers, else the machine's physical memory (sysconf); 0 when neither is known.
uint64_t DeviceMemoryBytes(const std::string& device);

class UtilizationSampler {
 public:
  // `device`: "cpu", "cuda" or "cuda:N" (N selects the NVML device index).
  explicit UtilizationSampler(const std::string& device);
  ~UtilizationSampler();
  UtilizationSampler(const UtilizationSampler&) = delete;
  UtilizationSampler& operator=(const UtilizationSampler&) = delete;

  // The utilisation in 0..1 since the previous call (CPU) or over NVML's last sample period (GPU); nullopt when
  // nothing is measurable yet (the first CPU sample) or at all.
  std::optional<double> Sample();
  // The GPU's memory (NVML): bytes in use and in all; nullopt without NVML or when it does not answer.
  struct DeviceMemory {
    uint64_t used_bytes = 0;
    uint64_t total_bytes = 0;
  };
  std::optional<DeviceMemory> Memory();
  // "nvml" or "cpu": what Sample() measures.
  const char* source() const;
  // The same as the worker protocol names it (Progress::utilization_device): "gpu" or "host_cpu" (the whole
  // machine's CPU, every process on it, not only the trainer's).
  std::string_view device_kind() const;

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
  std::optional<CpuTimes> last_cpu_;
};

}  // namespace parsyn::worker
