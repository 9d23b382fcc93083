// A fake libnvidia-ml.so.1 for tests: the NVML functions edgeaccel's helper calls, with NVML's
// signatures and return codes (edgeaccel/nvml/nvml_abi.h), answering from a script file.
//
// The script is "<path of this library>.script" (found through dladdr), so a fixture host that
// holds the library holds its script beside it, and nothing needs an environment variable. It is
// read again at nvmlInit_v2 and at every sample (nvmlDeviceGetTemperature), so a test changes
// what NVML says by rewriting it. Lines:
//   init=ok | fail:<nvmlReturn_t> | hang | crash | delay:<ms>
//   sample=ok | hang | crash | delay:<ms>
//     (delay: answers as for ok, <ms> milliseconds later, as a slow driver does: an NVML that
//     answers only after the daemon's first scan)
//   driver=580.159.04
//   cuda=13000
//   events=ok | unsupported
//   gpu uuid=GPU-... name=... minor=0 memory_mib=81559 cc=9.0 mig=disabled|enabled|unsupported
//       ecc=enabled|disabled temperature=34 power_mw=71000 util=3 mem_util=1 used_mib=0
//       sbe=0 dbe=0 throttle=0 lost=0|<nvmlReturn_t>
// Events: "<path of this library>.events", lines "<uuid> <xid>" (an Xid critical error) or
// "fail <nvmlReturn_t>" (the wait itself fails), appended by the test; nvmlEventSetWait_v2
// returns them in order, waiting on inotify for more until its timeout.
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "edgeaccel/nvml/nvml_abi.h"

namespace {

struct FakeGpu {
  std::map<std::string, std::string> values;
  std::string Get(const std::string& key, const std::string& otherwise = "") const {
    auto it = values.find(key);
    return it == values.end() ? otherwise : it->second;
  }
  unsigned long long Number(const std::string& key, unsigned long long otherwise = 0) const {
    auto it = values.find(key);
    return it == values.end() ? otherwise : std::strtoull(it->second.c_str(), nullptr, 10);
  }
};

std::mutex mu;
std::map<std::string, std::string> settings;
std::vector<FakeGpu> gpus(64);  // fixed storage: handles point into it
unsigned int gpu_count = 0;
bool initialised = false;
size_t events_read = 0;  // bytes of the events file already returned

std::string OwnPath() {
  Dl_info info = {};
  if (dladdr(reinterpret_cast<void*>(&OwnPath), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

void LoadScript() {
  std::ifstream in(OwnPath() + ".script");
  std::string line;
  settings.clear();
  unsigned int n = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first;
    if (!(words >> first)) continue;
    if (first == "gpu") {
      if (n >= gpus.size()) continue;
      FakeGpu gpu;
      std::string word;
      while (words >> word) {
        const size_t eq = word.find('=');
        if (eq != std::string::npos) gpu.values[word.substr(0, eq)] = word.substr(eq + 1);
      }
      // Names may hold spaces: "name=NVIDIA_H100_80GB_HBM3" is read with '_' as ' '.
      std::string name = gpu.Get("name");
      for (char& c : name) c = c == '_' ? ' ' : c;
      gpu.values["name"] = name;
      gpus[n++] = gpu;
    } else {
      const size_t eq = first.find('=');
      if (eq != std::string::npos) settings[first.substr(0, eq)] = first.substr(eq + 1);
    }
  }
  if (!initialised) gpu_count = n;  // the GPU list is what nvmlInit saw
}

void Act(const std::string& what) {
  if (what == "hang") {
    while (true) pause();
  }
  if (what == "crash") abort();
  if (what.rfind("delay:", 0) == 0) {
    usleep(static_cast<useconds_t>(std::atoi(what.c_str() + 6)) * 1000);
  }
}

FakeGpu* Gpu(nvmlDevice_t device) {
  for (unsigned int i = 0; i < gpu_count; ++i) {
    if (reinterpret_cast<nvmlDevice_t>(&gpus[i]) == device) return &gpus[i];
  }
  return nullptr;
}

nvmlReturn_t Lost(const FakeGpu& gpu) {
  return static_cast<nvmlReturn_t>(gpu.Number("lost", 0));
}

nvmlReturn_t CopyString(const std::string& value, char* out, unsigned int length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (value.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return NVML_SUCCESS;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2() {
  std::string init;
  {
    std::lock_guard<std::mutex> lock(mu);
    LoadScript();
    init = settings.count("init") ? settings["init"] : "ok";
  }
  Act(init);
  if (init.rfind("fail:", 0) == 0) return std::atoi(init.c_str() + 5);
  std::lock_guard<std::mutex> lock(mu);
  initialised = true;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown() {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  initialised = false;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(nvmlReturn_t ret) {
  switch (ret) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    default: return "Unknown Error";
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlSystemGetDriverVersion(char* version,
                                                                                unsigned int length) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  return CopyString(settings.count("driver") ? settings["driver"] : "580.159.04", version, length);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  std::lock_guard<std::mutex> lock(mu);
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *version = std::atoi(settings.count("cuda") ? settings["cuda"].c_str() : "13000");
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = gpu_count;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(
    unsigned int index, nvmlDevice_t* device) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
  *device = reinterpret_cast<nvmlDevice_t>(&gpus[index]);
  return NVML_SUCCESS;
}

#define FAKE_DEVICE_OR_RETURN(device)                      \
  std::lock_guard<std::mutex> lock(mu);                    \
  if (!initialised) return NVML_ERROR_UNINITIALIZED;       \
  FakeGpu* gpu = Gpu(device);                              \
  if (gpu == nullptr) return NVML_ERROR_INVALID_ARGUMENT;  \
  if (Lost(*gpu) != NVML_SUCCESS) return Lost(*gpu)

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device,
                                                                       char* uuid,
                                                                       unsigned int length) {
  FAKE_DEVICE_OR_RETURN(device);
  return CopyString(gpu->Get("uuid"), uuid, length);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device,
                                                                       char* name,
                                                                       unsigned int length) {
  FAKE_DEVICE_OR_RETURN(device);
  return CopyString(gpu->Get("name"), name, length);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device,
                                                                              unsigned int* minor) {
  FAKE_DEVICE_OR_RETURN(device);
  *minor = static_cast<unsigned int>(gpu->Number("minor"));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device,
                                                                             nvmlMemory_t* memory) {
  FAKE_DEVICE_OR_RETURN(device);
  memory->total = gpu->Number("memory_mib") << 20;
  memory->used = gpu->Number("used_mib") << 20;
  memory->free = memory->total - memory->used;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCudaComputeCapability(
    nvmlDevice_t device, int* major, int* minor) {
  FAKE_DEVICE_OR_RETURN(device);
  const std::string cc = gpu->Get("cc", "9.0");
  *major = std::atoi(cc.c_str());
  *minor = std::atoi(cc.c_str() + cc.find('.') + 1);
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device,
                                                                          unsigned int* current,
                                                                          unsigned int* pending) {
  FAKE_DEVICE_OR_RETURN(device);
  const std::string mig = gpu->Get("mig", "unsupported");
  if (mig == "unsupported") return NVML_ERROR_NOT_SUPPORTED;
  *current = *pending = mig == "enabled" ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device,
                                                                          int* current,
                                                                          int* pending) {
  FAKE_DEVICE_OR_RETURN(device);
  const std::string ecc = gpu->Get("ecc", "enabled");
  if (ecc == "unsupported") return NVML_ERROR_NOT_SUPPORTED;
  *current = *pending = ecc == "enabled" ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}

// Where a sample starts: the script is read again, and may hang or crash the caller.
__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                                              int sensor,
                                                                              unsigned int* temp) {
  std::string sample;
  {
    std::lock_guard<std::mutex> lock(mu);
    LoadScript();
    sample = settings.count("sample") ? settings["sample"] : "ok";
  }
  Act(sample);
  FAKE_DEVICE_OR_RETURN(device);
  if (sensor != NVML_TEMPERATURE_GPU || temp == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *temp = static_cast<unsigned int>(gpu->Number("temperature", 33));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device,
                                                                             unsigned int* power) {
  FAKE_DEVICE_OR_RETURN(device);
  *power = static_cast<unsigned int>(gpu->Number("power_mw", 70000));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUtilizationRates(
    nvmlDevice_t device, nvmlUtilization_t* utilization) {
  FAKE_DEVICE_OR_RETURN(device);
  utilization->gpu = static_cast<unsigned int>(gpu->Number("util"));
  utilization->memory = static_cast<unsigned int>(gpu->Number("mem_util"));
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetTotalEccErrors(
    nvmlDevice_t device, int error_type, int counter_type, unsigned long long* count) {
  FAKE_DEVICE_OR_RETURN(device);
  if (counter_type != NVML_VOLATILE_ECC && counter_type != NVML_AGGREGATE_ECC) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *count = gpu->Number(error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED ? "sbe" : "dbe");
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(
    nvmlDevice_t device, unsigned long long* reasons) {
  FAKE_DEVICE_OR_RETURN(device);
  *reasons = gpu->Number("throttle");
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  std::lock_guard<std::mutex> lock(mu);
  if (!initialised) return NVML_ERROR_UNINITIALIZED;
  static int the_set;
  *set = reinterpret_cast<nvmlEventSet_t>(&the_set);
  // Only what happens from now on, as NVML: a fresh helper never sees an earlier one's events.
  std::ifstream in(OwnPath() + ".events", std::ios::ate);
  events_read = in ? static_cast<size_t>(in.tellg()) : 0;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetSupportedEventTypes(
    nvmlDevice_t device, unsigned long long* types) {
  FAKE_DEVICE_OR_RETURN(device);
  *types = settings["events"] == "unsupported"
               ? 0
               : (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
                  nvmlEventTypeSingleBitEccError);
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceRegisterEvents(
    nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
  FAKE_DEVICE_OR_RETURN(device);
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (settings["events"] == "unsupported") return NVML_ERROR_NOT_SUPPORTED;
  (void)types;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set,
                                                                         nvmlEventData_t* data,
                                                                         unsigned int timeout_ms) {
  if (set == nullptr || data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const std::string path = OwnPath() + ".events";
  const std::string directory = path.substr(0, path.rfind('/'));
  const int inotify = inotify_init1(IN_CLOEXEC);
  if (inotify >= 0) {
    inotify_add_watch(inotify, directory.c_str(), IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO);
  }
  const auto close_inotify = [inotify] {
    if (inotify >= 0) close(inotify);
  };
  while (true) {
    std::string text;
    {
      std::ifstream in(path);
      std::stringstream all;
      all << in.rdbuf();
      text = all.str();
    }
    {
    std::lock_guard<std::mutex> lock(mu);
    if (text.size() > events_read) {
      const size_t newline = text.find('\n', events_read);
      if (newline != std::string::npos) {
        std::istringstream line(text.substr(events_read, newline - events_read));
        events_read = newline + 1;
        std::string who;
        unsigned long long value = 0;
        line >> who >> value;
        if (who == "fail") {
          close_inotify();
          return static_cast<nvmlReturn_t>(value);
        }
        for (unsigned int i = 0; i < gpu_count; ++i) {
          if (gpus[i].Get("uuid") != who) continue;
          data->device = reinterpret_cast<nvmlDevice_t>(&gpus[i]);
          data->eventType = nvmlEventTypeXidCriticalError;
          data->eventData = value;
          data->gpuInstanceId = 0xFFFFFFFFu;
          data->computeInstanceId = 0xFFFFFFFFu;
          close_inotify();
          return NVML_SUCCESS;
        }
        continue;  // an event for a GPU this NVML does not know: skipped
      }
    }
    }
    if (inotify < 0) {
      close_inotify();
      return NVML_ERROR_TIMEOUT;
    }
    struct pollfd fd = {inotify, POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(timeout_ms));
    if (ready <= 0) {
      close_inotify();
      return NVML_ERROR_TIMEOUT;
    }
    char buffer[4096];
    (void)!read(inotify, buffer, sizeof(buffer));
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t) {
  return NVML_SUCCESS;
}

}  // extern "C"
