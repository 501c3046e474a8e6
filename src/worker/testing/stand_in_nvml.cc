// A stand-in for NVIDIA's libnvidia-ml, for tests on machines without an NVIDIA GPU: it exports the few NVML calls
// the worker makes (worker/telemetry.cc), with C linkage as the real library does, and answers with values the test
// sets in the environment:
//   PARSYN_STAND_IN_NVML_UTILIZATION   GPU utilisation in percent (default 0)
//   PARSYN_STAND_IN_NVML_MEMORY_USED   bytes of device memory in use (default 0)
//   PARSYN_STAND_IN_NVML_MEMORY_TOTAL  bytes of device memory (default 0)
//   PARSYN_STAND_IN_NVML_DEVICES       how many devices there are (default 1)
// The worker loads it in place of the real library through PARSYN_NVML_LIBRARY. Return values follow NVML's:
// 0 NVML_SUCCESS, 2 NVML_ERROR_INVALID_ARGUMENT. Structures have NVML's layout.
#include <cstdint>
#include <cstdlib>

extern "C" {

typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlDevice_st* nvmlDevice_t;

static unsigned long long Setting(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::strtoull(value, nullptr, 10) : 0;
}

int nvmlInit_v2(void) { return 0; }

int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  const char* devices = std::getenv("PARSYN_STAND_IN_NVML_DEVICES");
  const unsigned long long count = devices != nullptr ? std::strtoull(devices, nullptr, 10) : 1;
  if (device == nullptr || index >= count) return 2;
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(index) + 1);
  return 0;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* rates) {
  if (device == nullptr || rates == nullptr) return 2;
  rates->gpu = static_cast<unsigned int>(Setting("PARSYN_STAND_IN_NVML_UTILIZATION"));
  rates->memory = 0;
  return 0;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (device == nullptr || memory == nullptr) return 2;
  memory->total = Setting("PARSYN_STAND_IN_NVML_MEMORY_TOTAL");
  memory->used = Setting("PARSYN_STAND_IN_NVML_MEMORY_USED");
  memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
  return 0;
}

}  // extern "C"
