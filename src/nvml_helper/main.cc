// edgeaccel-nvml-helper: asks NVML (the host's libnvidia-ml.so.1) about the discrete NVIDIA
// GPUs, and says what it learns on stdout (edgeaccel/nvml/nvml_protocol.h).
//
// Why a process of its own: the daemon is one static binary, and a static glibc cannot dlopen
// the host's libnvidia-ml.so.1 reliably; and an NVML call can hang or crash (a driver reload, a
// GPU fallen off the bus). Here a hang or a crash costs the daemon nothing: it kills and
// restarts this process (nvml/nvml_supervisor.h). This program is linked dynamically against the
// C library only (the C++ runtime is linked in), which the image ships beside it.
//
//   edgeaccel-nvml-helper --library=<path of libnvidia-ml.so.1> [--event_wait_ms=60000]
//
// Exits 0 when stdin closes (the daemon is gone or done), 3 when NVML cannot be used (after an
// `unavailable` record), 4 when NVML's event wait fails (after `event_wait_failed`): the daemon
// starts a fresh one, which initialises NVML again.
#include <dlfcn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "edgeaccel/nvml/nvml_abi.h"
#include "edgeaccel/nvml/nvml_protocol.h"

namespace edgeaccel {
namespace {

std::mutex output_mu;

// One record, in one write(2) where it fits: the daemon reads lines, and two threads write.
void Emit(const NvmlRecord& record) {
  const std::string line = EncodeNvmlRecord(record);
  std::lock_guard<std::mutex> lock(output_mu);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(STDOUT_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0);  // the daemon closed the pipe: nobody to tell anything
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void Unavailable(const std::string& reason) {
  Emit(NvmlRecord{"unavailable", {}}.Add("reason", reason));
  _exit(3);
}

// The NVML functions, looked up in the library.
struct Nvml {
  nvmlInit_v2_fn Init = nullptr;
  nvmlErrorString_fn ErrorString = nullptr;
  nvmlSystemGetDriverVersion_fn SystemGetDriverVersion = nullptr;
  nvmlSystemGetCudaDriverVersion_v2_fn SystemGetCudaDriverVersion = nullptr;
  nvmlDeviceGetCount_v2_fn DeviceGetCount = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn DeviceGetHandleByIndex = nullptr;
  nvmlDeviceGetUUID_fn DeviceGetUUID = nullptr;
  nvmlDeviceGetName_fn DeviceGetName = nullptr;
  nvmlDeviceGetMinorNumber_fn DeviceGetMinorNumber = nullptr;
  nvmlDeviceGetMemoryInfo_fn DeviceGetMemoryInfo = nullptr;
  nvmlDeviceGetCudaComputeCapability_fn DeviceGetCudaComputeCapability = nullptr;
  nvmlDeviceGetMigMode_fn DeviceGetMigMode = nullptr;
  nvmlDeviceGetEccMode_fn DeviceGetEccMode = nullptr;
  nvmlDeviceGetTemperature_fn DeviceGetTemperature = nullptr;
  nvmlDeviceGetPowerUsage_fn DeviceGetPowerUsage = nullptr;
  nvmlDeviceGetUtilizationRates_fn DeviceGetUtilizationRates = nullptr;
  nvmlDeviceGetTotalEccErrors_fn DeviceGetTotalEccErrors = nullptr;
  nvmlDeviceGetCurrentClocksThrottleReasons_fn DeviceGetCurrentClocksThrottleReasons = nullptr;
  nvmlEventSetCreate_fn EventSetCreate = nullptr;
  nvmlDeviceGetSupportedEventTypes_fn DeviceGetSupportedEventTypes = nullptr;
  nvmlDeviceRegisterEvents_fn DeviceRegisterEvents = nullptr;
  nvmlEventSetWait_v2_fn EventSetWait = nullptr;

  std::string Error(nvmlReturn_t ret) const {
    const char* text = ErrorString != nullptr ? ErrorString(ret) : nullptr;
    return (text != nullptr ? std::string(text) : std::string("error")) + " (" +
           std::to_string(ret) + ")";
  }
};

template <typename Fn>
void Find(void* library, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
}

template <typename Fn>
void FindFirst(void* library, std::initializer_list<const char*> names, Fn* fn) {
  for (const char* name : names) {
    Find(library, name, fn);
    if (*fn != nullptr) return;
  }
}

Nvml Load(const std::string& path) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    Unavailable(std::string("cannot load ") + path + ": " + (why != nullptr ? why : "dlopen failed"));
  }
  Nvml nvml;
  Find(library, "nvmlInit_v2", &nvml.Init);
  Find(library, "nvmlErrorString", &nvml.ErrorString);
  Find(library, "nvmlSystemGetDriverVersion", &nvml.SystemGetDriverVersion);
  FindFirst(library, {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"},
            &nvml.SystemGetCudaDriverVersion);
  Find(library, "nvmlDeviceGetCount_v2", &nvml.DeviceGetCount);
  Find(library, "nvmlDeviceGetHandleByIndex_v2", &nvml.DeviceGetHandleByIndex);
  Find(library, "nvmlDeviceGetUUID", &nvml.DeviceGetUUID);
  Find(library, "nvmlDeviceGetName", &nvml.DeviceGetName);
  Find(library, "nvmlDeviceGetMinorNumber", &nvml.DeviceGetMinorNumber);
  Find(library, "nvmlDeviceGetMemoryInfo", &nvml.DeviceGetMemoryInfo);
  Find(library, "nvmlDeviceGetCudaComputeCapability", &nvml.DeviceGetCudaComputeCapability);
  Find(library, "nvmlDeviceGetMigMode", &nvml.DeviceGetMigMode);
  Find(library, "nvmlDeviceGetEccMode", &nvml.DeviceGetEccMode);
  Find(library, "nvmlDeviceGetTemperature", &nvml.DeviceGetTemperature);
  Find(library, "nvmlDeviceGetPowerUsage", &nvml.DeviceGetPowerUsage);
  Find(library, "nvmlDeviceGetUtilizationRates", &nvml.DeviceGetUtilizationRates);
  Find(library, "nvmlDeviceGetTotalEccErrors", &nvml.DeviceGetTotalEccErrors);
  // Renamed "ClocksEventReasons" in R535; the old name is still exported.
  FindFirst(library,
            {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
            &nvml.DeviceGetCurrentClocksThrottleReasons);
  Find(library, "nvmlEventSetCreate", &nvml.EventSetCreate);
  Find(library, "nvmlDeviceGetSupportedEventTypes", &nvml.DeviceGetSupportedEventTypes);
  Find(library, "nvmlDeviceRegisterEvents", &nvml.DeviceRegisterEvents);
  // _v1 fills the same record without the MIG instance ids (they stay zeroed).
  FindFirst(library, {"nvmlEventSetWait_v2", "nvmlEventSetWait"}, &nvml.EventSetWait);
  std::vector<std::string> missing;
  if (nvml.Init == nullptr) missing.push_back("nvmlInit_v2");
  if (nvml.DeviceGetCount == nullptr) missing.push_back("nvmlDeviceGetCount_v2");
  if (nvml.DeviceGetHandleByIndex == nullptr) missing.push_back("nvmlDeviceGetHandleByIndex_v2");
  if (nvml.DeviceGetUUID == nullptr) missing.push_back("nvmlDeviceGetUUID");
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    Unavailable(path + " is not NVML (or a driver older than R450): it lacks " + list);
  }
  return nvml;
}

struct Gpu {
  nvmlDevice_t handle = nullptr;
  std::string uuid;
};

// Every answer NVML can give about a GPU that is there: anything else (GPU_IS_LOST, UNKNOWN,
// a timeout) means NVML no longer answers for it.
bool Answers(nvmlReturn_t ret) {
  return ret == NVML_SUCCESS || ret == NVML_ERROR_NOT_SUPPORTED ||
         ret == NVML_ERROR_NO_PERMISSION;
}

void Sample(const Nvml& nvml, const std::vector<Gpu>& gpus) {
  for (const Gpu& gpu : gpus) {
    NvmlRecord record{"sample", {}};
    record.Add("uuid", gpu.uuid);
    unsigned int temperature = 0;
    nvmlReturn_t ret = nvml.DeviceGetTemperature != nullptr
                           ? nvml.DeviceGetTemperature(gpu.handle, NVML_TEMPERATURE_GPU, &temperature)
                           : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!Answers(ret) && ret != NVML_ERROR_FUNCTION_NOT_FOUND) {
      record.Add("lost", nvml.Error(ret));
      Emit(record);
      continue;
    }
    if (ret == NVML_SUCCESS) record.Add("temperature_c", std::to_string(temperature));
    unsigned int milliwatts = 0;
    if (nvml.DeviceGetPowerUsage != nullptr &&
        nvml.DeviceGetPowerUsage(gpu.handle, &milliwatts) == NVML_SUCCESS) {
      char watts[32];
      snprintf(watts, sizeof(watts), "%.3f", milliwatts / 1000.0);
      record.Add("power_w", watts);
    }
    nvmlUtilization_t utilization = {};
    if (nvml.DeviceGetUtilizationRates != nullptr &&
        nvml.DeviceGetUtilizationRates(gpu.handle, &utilization) == NVML_SUCCESS) {
      record.Add("sm_util_percent", std::to_string(utilization.gpu));
      record.Add("memory_util_percent", std::to_string(utilization.memory));
    }
    nvmlMemory_t memory = {};
    if (nvml.DeviceGetMemoryInfo != nullptr &&
        nvml.DeviceGetMemoryInfo(gpu.handle, &memory) == NVML_SUCCESS) {
      record.Add("memory_used_mib", std::to_string(memory.used >> 20));
      record.Add("memory_total_mib", std::to_string(memory.total >> 20));
    }
    if (nvml.DeviceGetTotalEccErrors != nullptr) {
      unsigned long long count = 0;
      if (nvml.DeviceGetTotalEccErrors(gpu.handle, NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                       NVML_VOLATILE_ECC, &count) == NVML_SUCCESS) {
        record.Add("ecc_corrected", std::to_string(count));
      }
      if (nvml.DeviceGetTotalEccErrors(gpu.handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                       NVML_VOLATILE_ECC, &count) == NVML_SUCCESS) {
        record.Add("ecc_uncorrected", std::to_string(count));
      }
    }
    unsigned long long reasons = 0;
    if (nvml.DeviceGetCurrentClocksThrottleReasons != nullptr &&
        nvml.DeviceGetCurrentClocksThrottleReasons(gpu.handle, &reasons) == NVML_SUCCESS) {
      record.Add("throttle_reasons", std::to_string(reasons));
    }
    Emit(record);
  }
  Emit(NvmlRecord{"sampled", {}});
}

void WaitForEvents(const Nvml& nvml, nvmlEventSet_t set, const std::vector<Gpu>& gpus,
                   unsigned int wait_ms) {
  while (true) {
    nvmlEventData_t data = {};
    const nvmlReturn_t ret = nvml.EventSetWait(set, &data, wait_ms);
    if (ret == NVML_ERROR_TIMEOUT) continue;
    if (ret != NVML_SUCCESS) {
      Emit(NvmlRecord{"event_wait_failed", {}}.Add("reason", nvml.Error(ret)));
      _exit(4);
    }
    std::string uuid;
    for (const Gpu& gpu : gpus) {
      if (gpu.handle == data.device) uuid = gpu.uuid;
    }
    const char* type = (data.eventType & nvmlEventTypeXidCriticalError) != 0   ? "xid"
                       : (data.eventType & nvmlEventTypeDoubleBitEccError) != 0 ? "dbe"
                                                                               : "sbe";
    Emit(NvmlRecord{"xid", {}}
             .Add("uuid", uuid)
             .Add("type", type)
             .Add("xid", std::to_string(data.eventData)));
  }
}

int Run(int argc, char** argv) {
  std::string library;
  unsigned int wait_ms = 60000;  // a wake-up a minute while no event comes
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--library=", 0) == 0) {
      library = arg.substr(10);
    } else if (arg.rfind("--event_wait_ms=", 0) == 0) {
      wait_ms = static_cast<unsigned int>(std::strtoul(arg.c_str() + 16, nullptr, 10));
    } else {
      fprintf(stderr, "edgeaccel-nvml-helper: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (library.empty()) {
    fprintf(stderr, "usage: edgeaccel-nvml-helper --library=<path of libnvidia-ml.so.1>\n");
    return 2;
  }
  const Nvml nvml = Load(library);
  if (const nvmlReturn_t ret = nvml.Init(); ret != NVML_SUCCESS) {
    Unavailable("nvmlInit_v2 failed: " + nvml.Error(ret));
  }
  NvmlRecord hello{"hello", {}};
  hello.Add("library", library);
  char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (nvml.SystemGetDriverVersion != nullptr &&
      nvml.SystemGetDriverVersion(driver, sizeof(driver)) == NVML_SUCCESS) {
    driver[sizeof(driver) - 1] = '\0';
    hello.Add("driver", driver);
  }
  int cuda = 0;
  if (nvml.SystemGetCudaDriverVersion != nullptr &&
      nvml.SystemGetCudaDriverVersion(&cuda) == NVML_SUCCESS && cuda > 0) {
    hello.Add("cuda", std::to_string(cuda / 1000) + "." + std::to_string((cuda % 1000) / 10));
  }
  Emit(hello);

  unsigned int count = 0;
  if (const nvmlReturn_t ret = nvml.DeviceGetCount(&count); ret != NVML_SUCCESS) {
    Unavailable("nvmlDeviceGetCount_v2 failed: " + nvml.Error(ret));
  }
  nvmlEventSet_t set = nullptr;
  std::string set_error;
  if (nvml.EventSetCreate == nullptr || nvml.DeviceRegisterEvents == nullptr ||
      nvml.EventSetWait == nullptr) {
    set_error = "unsupported: this NVML has no event API";
  } else if (const nvmlReturn_t ret = nvml.EventSetCreate(&set); ret != NVML_SUCCESS) {
    set_error = "failed: nvmlEventSetCreate: " + nvml.Error(ret);
    set = nullptr;
  }
  std::vector<Gpu> gpus;
  bool any_registered = false;
  for (unsigned int index = 0; index < count; ++index) {
    Gpu gpu;
    if (nvml.DeviceGetHandleByIndex(index, &gpu.handle) != NVML_SUCCESS) continue;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvml.DeviceGetUUID(gpu.handle, uuid, sizeof(uuid)) != NVML_SUCCESS) continue;
    uuid[sizeof(uuid) - 1] = '\0';
    gpu.uuid = uuid;
    NvmlRecord record{"gpu", {}};
    record.Add("uuid", gpu.uuid).Add("index", std::to_string(index));
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    if (nvml.DeviceGetName != nullptr && nvml.DeviceGetName(gpu.handle, name, sizeof(name)) == NVML_SUCCESS) {
      name[sizeof(name) - 1] = '\0';
      record.Add("name", name);
    }
    unsigned int minor = 0;
    if (nvml.DeviceGetMinorNumber != nullptr &&
        nvml.DeviceGetMinorNumber(gpu.handle, &minor) == NVML_SUCCESS) {
      record.Add("minor", std::to_string(minor));
    }
    nvmlMemory_t memory = {};
    if (nvml.DeviceGetMemoryInfo != nullptr &&
        nvml.DeviceGetMemoryInfo(gpu.handle, &memory) == NVML_SUCCESS) {
      record.Add("memory_mib", std::to_string(memory.total >> 20));
    }
    int major = 0, minor_cc = 0;
    if (nvml.DeviceGetCudaComputeCapability != nullptr &&
        nvml.DeviceGetCudaComputeCapability(gpu.handle, &major, &minor_cc) == NVML_SUCCESS) {
      record.Add("compute_capability", std::to_string(major) + "." + std::to_string(minor_cc));
    }
    if (nvml.DeviceGetMigMode != nullptr) {
      unsigned int current = 0, pending = 0;
      const nvmlReturn_t ret = nvml.DeviceGetMigMode(gpu.handle, &current, &pending);
      if (ret == NVML_SUCCESS) {
        record.Add("mig_capable", "true");
        record.Add("mig_mode", current == NVML_DEVICE_MIG_ENABLE ? "enabled" : "disabled");
      } else if (ret == NVML_ERROR_NOT_SUPPORTED) {
        record.Add("mig_capable", "false");
      }
    }
    if (nvml.DeviceGetEccMode != nullptr) {
      int current = 0, pending = 0;
      if (nvml.DeviceGetEccMode(gpu.handle, &current, &pending) == NVML_SUCCESS) {
        record.Add("ecc_enabled", current == NVML_FEATURE_ENABLED ? "true" : "false");
      }
    }
    // As NVIDIA's device plugin: Xid critical errors and ECC events, where the GPU has them.
    std::string events = set_error;
    if (set != nullptr) {
      unsigned long long mask = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
                                nvmlEventTypeSingleBitEccError;
      unsigned long long supported = mask;
      if (nvml.DeviceGetSupportedEventTypes != nullptr &&
          nvml.DeviceGetSupportedEventTypes(gpu.handle, &supported) == NVML_SUCCESS) {
        mask &= supported;
      }
      const nvmlReturn_t ret = (mask & nvmlEventTypeXidCriticalError) == 0
                                   ? NVML_ERROR_NOT_SUPPORTED
                                   : nvml.DeviceRegisterEvents(gpu.handle, mask, set);
      if (ret == NVML_SUCCESS) {
        events = "registered";
        any_registered = true;
      } else if (ret == NVML_ERROR_NOT_SUPPORTED) {
        events = "unsupported: the GPU reports no Xid events";
      } else {
        events = "failed: nvmlDeviceRegisterEvents: " + nvml.Error(ret);
      }
    }
    record.Add("events", events);
    Emit(record);
    gpus.push_back(gpu);
  }
  Emit(NvmlRecord{"ready", {}});

  if (any_registered) {
    std::thread([&nvml, set, gpus, wait_ms] { WaitForEvents(nvml, set, gpus, wait_ms); }).detach();
  }
  // Requests, one per line, until the daemon closes stdin.
  std::string pending;
  char buffer[256];
  while (true) {
    const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0);  // no nvmlShutdown: the event thread may be inside NVML
    pending.append(buffer, static_cast<size_t>(n));
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      if (line == "sample") Sample(nvml, gpus);
    }
  }
}

}  // namespace
}  // namespace edgeaccel

int main(int argc, char** argv) {
  // Dies with the daemon, whatever killed it (stdin's end covers a daemon gone before this
  // line; getppid() cannot tell, as the daemon is PID 1 in its container); and a write to a
  // closed pipe is an error, not a signal.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGPIPE, SIG_IGN);
  return edgeaccel::Run(argc, argv);
}
