#include "worker/telemetry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "protocol/messages.h"

namespace parsyn::worker {

std::optional<CpuTimes> ParseProcStatCpuLine(const std::string& line) {
  std::istringstream in(line);
  std::string label;
  in >> label;
  if (label != "cpu") return std::nullopt;
  // user nice system idle iowait irq softirq steal (guest times are already inside user and nice).
  uint64_t v[8] = {};
  int read = 0;
  for (; read < 8 && (in >> v[read]); ++read) {
  }
  if (read < 4) return std::nullopt;
  const uint64_t idle = v[3] + v[4];
  uint64_t total = 0;
  for (int i = 0; i < read; ++i) total += v[i];
  return CpuTimes{.busy = total - idle, .total = total};
}

// The few NVML entry points used, resolved by name; the library stays loaded for the sampler's lifetime.
struct UtilizationSampler::Nvml {
  struct Rates {
    unsigned int gpu;
    unsigned int memory;
  };
  using InitFn = int (*)();
  using ShutdownFn = int (*)();
  using HandleFn = int (*)(unsigned int, void**);
  using UtilFn = int (*)(void*, Rates*);
  struct Memory {  // nvmlMemory_t
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  using MemoryFn = int (*)(void*, Memory*);

  void* lib = nullptr;
  ShutdownFn shutdown = nullptr;
  UtilFn utilization = nullptr;
  MemoryFn memory = nullptr;  // optional
  void* device = nullptr;

  static std::unique_ptr<Nvml> Load(unsigned int index) {
    // PARSYN_NVML_LIBRARY: another library in NVML's place (a test's stand-in, or a driver outside the loader's path).
    const char* named = std::getenv("PARSYN_NVML_LIBRARY");
    void* lib = dlopen(named != nullptr && *named != '\0' ? named : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    auto nvml = std::make_unique<Nvml>();
    nvml->lib = lib;
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    nvml->shutdown = reinterpret_cast<ShutdownFn>(dlsym(lib, "nvmlShutdown"));
    auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    nvml->utilization = reinterpret_cast<UtilFn>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    nvml->memory = reinterpret_cast<MemoryFn>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    if (init == nullptr || nvml->shutdown == nullptr || handle == nullptr || nvml->utilization == nullptr ||
        init() != 0) {
      nvml->shutdown = nullptr;
      return nullptr;  // the destructor closes the library
    }
    if (handle(index, &nvml->device) != 0) return nullptr;
    return nvml;
  }

  ~Nvml() {
    if (shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
};

UtilizationSampler::UtilizationSampler(const std::string& device) {
  if (device.starts_with("cuda")) {
    unsigned int index = 0;
    if (device.size() > 5 && device[4] == ':') {
      std::from_chars(device.data() + 5, device.data() + device.size(), index);  // the CLI validated the form
    }
    nvml_ = Nvml::Load(index);
  }
}

UtilizationSampler::~UtilizationSampler() = default;

const char* UtilizationSampler::source() const { return nvml_ ? "nvml" : "cpu"; }

std::string_view UtilizationSampler::device_kind() const {
  return nvml_ ? protocol::kUtilizationGpu : protocol::kUtilizationHostCpu;
}

std::optional<UtilizationSampler::DeviceMemory> UtilizationSampler::Memory() {
  if (!nvml_ || nvml_->memory == nullptr) return std::nullopt;
  Nvml::Memory m{};
  if (nvml_->memory(nvml_->device, &m) != 0 || m.total == 0) return std::nullopt;
  return DeviceMemory{.used_bytes = m.used, .total_bytes = m.total};
}

std::optional<double> UtilizationSampler::Sample() {
  if (nvml_) {
    Nvml::Rates rates{};
    if (nvml_->utilization(nvml_->device, &rates) == 0) return rates.gpu / 100.0;
    return std::nullopt;
  }
  std::ifstream stat("/proc/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  std::optional<CpuTimes> now = ParseProcStatCpuLine(line);
  if (!now) return std::nullopt;
  std::optional<double> result;
  if (last_cpu_ && now->total > last_cpu_->total) {
    result = static_cast<double>(now->busy - last_cpu_->busy) / static_cast<double>(now->total - last_cpu_->total);
  }
  last_cpu_ = now;
  return result;
}

uint64_t DeviceMemoryBytes(const std::string& device) {
  if (device.starts_with("cuda")) {
    UtilizationSampler sampler(device);
    if (std::optional<UtilizationSampler::DeviceMemory> m = sampler.Memory()) return m->total_bytes;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
}

}  // namespace parsyn::worker
