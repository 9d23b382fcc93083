// The part of NVML's C ABI (libnvidia-ml.so.1) that edgeaccel calls, declared by us.
//
// Types, constants and signatures as NVIDIA's nvml.h defines them (CUDA 12/13 toolkits; the
// functions below have kept their signatures since driver R450). No NVIDIA header is needed to
// build: the helper (src/nvml_helper) looks each function up with dlsym, and the fake library
// the tests build (tests/support/fake_nvml.cc) defines them with exactly these signatures.
// docs/nvml.md lists where each fact comes from.
#ifndef EDGEACCEL_NVML_NVML_ABI_H_
#define EDGEACCEL_NVML_NVML_ABI_H_

extern "C" {

typedef int nvmlReturn_t;  // an enum in nvml.h: int-sized, passed and returned as int
enum : nvmlReturn_t {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INSUFFICIENT_POWER = 8,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_IRQ_ISSUE = 11,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_CORRUPTED_INFOROM = 14,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_OPERATING_SYSTEM = 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

typedef struct nvmlMemory_st {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlUtilization_st {
  unsigned int gpu;     // percent of time a kernel ran (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL)
  unsigned int memory;  // percent of time memory was read or written
} nvmlUtilization_t;

// nvmlEventSetWait_v2's record (nvml.h since R450: the MIG instance ids were added with _v2).
typedef struct nvmlEventData_st {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid, for nvmlEventTypeXidCriticalError; 999: unknown
  unsigned int gpuInstanceId;    // 0xFFFFFFFF when not attributable to a MIG instance
  unsigned int computeInstanceId;
} nvmlEventData_t;

constexpr unsigned long long nvmlEventTypeSingleBitEccError = 0x1ULL;
constexpr unsigned long long nvmlEventTypeDoubleBitEccError = 0x2ULL;
constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8ULL;

enum { NVML_TEMPERATURE_GPU = 0 };                                        // nvmlTemperatureSensors_t
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };                   // nvmlEccCounterType_t
enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };             // nvmlEnableState_t
enum { NVML_DEVICE_MIG_DISABLE = 0, NVML_DEVICE_MIG_ENABLE = 1 };

constexpr unsigned NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;

// The functions, as pointer types for dlsym.
using nvmlInit_v2_fn = nvmlReturn_t (*)();
using nvmlShutdown_fn = nvmlReturn_t (*)();
using nvmlErrorString_fn = const char* (*)(nvmlReturn_t);
using nvmlSystemGetDriverVersion_fn = nvmlReturn_t (*)(char*, unsigned int);
using nvmlSystemGetCudaDriverVersion_v2_fn = nvmlReturn_t (*)(int*);  // 13000 = CUDA 13.0
using nvmlDeviceGetCount_v2_fn = nvmlReturn_t (*)(unsigned int*);
using nvmlDeviceGetHandleByIndex_v2_fn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using nvmlDeviceGetUUID_fn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using nvmlDeviceGetName_fn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using nvmlDeviceGetMinorNumber_fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);
using nvmlDeviceGetMemoryInfo_fn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using nvmlDeviceGetCudaComputeCapability_fn = nvmlReturn_t (*)(nvmlDevice_t, int*, int*);
using nvmlDeviceGetMigMode_fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, unsigned int*);
using nvmlDeviceGetEccMode_fn = nvmlReturn_t (*)(nvmlDevice_t, int*, int*);
using nvmlDeviceGetTemperature_fn = nvmlReturn_t (*)(nvmlDevice_t, int, unsigned int*);
using nvmlDeviceGetPowerUsage_fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);  // milliwatts
using nvmlDeviceGetUtilizationRates_fn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using nvmlDeviceGetTotalEccErrors_fn = nvmlReturn_t (*)(nvmlDevice_t, int, int,
                                                        unsigned long long*);
using nvmlDeviceGetCurrentClocksThrottleReasons_fn = nvmlReturn_t (*)(nvmlDevice_t,
                                                                      unsigned long long*);
using nvmlEventSetCreate_fn = nvmlReturn_t (*)(nvmlEventSet_t*);
using nvmlDeviceGetSupportedEventTypes_fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);
using nvmlDeviceRegisterEvents_fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long,
                                                     nvmlEventSet_t);
using nvmlEventSetWait_v2_fn = nvmlReturn_t (*)(nvmlEventSet_t, nvmlEventData_t*, unsigned int);
using nvmlEventSetFree_fn = nvmlReturn_t (*)(nvmlEventSet_t);

}  // extern "C"

#endif  // EDGEACCEL_NVML_NVML_ABI_H_
