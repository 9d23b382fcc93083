// What the NVML helper process and the daemon say to each other over a pipe.
//
// One record per line: a kind, then tab-separated key=value fields, values escaped (%, tab,
// newline, and every other control byte as %XX), so a GPU name or an NVML error string can never
// split a record. Plain C++ only: the helper links nothing but the C and C++ runtimes.
//
// helper -> daemon
//   unavailable reason=...            NVML cannot be used (library, nvmlInit); the helper exits 3
//   hello library= driver= cuda=      NVML initialised; `cuda` is "13.0" (driver API version)
//   gpu uuid= index= minor= name= memory_mib= compute_capability= mig_capable= mig_mode=
//       ecc_enabled= events=          one per GPU NVML lists (`events`: registered | unsupported
//                                     | failed: <why>)
//   ready                             the inventory is complete
//   xid uuid= xid= type=              an NVML event (type: xid | dbe | sbe)
//   event_wait_failed reason=         nvmlEventSetWait failed: no event can be seen any more
//   sample uuid= temperature_c= power_w= sm_util_percent= memory_util_percent= memory_used_mib=
//       memory_total_mib= ecc_corrected= ecc_uncorrected= throttle_reasons= [lost=<why>]
//   sampled                           the end of the answer to one `sample` request
// daemon -> helper
//   sample                            read every GPU's telemetry now
#ifndef EDGEACCEL_NVML_NVML_PROTOCOL_H_
#define EDGEACCEL_NVML_NVML_PROTOCOL_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edgeaccel {

struct NvmlRecord {
  std::string kind;
  std::vector<std::pair<std::string, std::string>> fields;

  NvmlRecord& Add(std::string key, std::string value) {
    fields.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  // The value of `key`, or empty.
  std::string Get(std::string_view key) const;
  bool Has(std::string_view key) const;
};

// The record as one line, with its '\n'.
std::string EncodeNvmlRecord(const NvmlRecord& record);

// The record in `line` (without its '\n'); nullopt when it is not one (no kind, a field without
// '=', a bad escape).
std::optional<NvmlRecord> DecodeNvmlRecord(std::string_view line);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NVML_NVML_PROTOCOL_H_
