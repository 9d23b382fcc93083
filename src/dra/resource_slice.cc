#include "edgeaccel/dra/resource_slice.h"

#include <cmath>
#include <iterator>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/dra_driver.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

std::string Fact(const Device& device, const std::string& key) {
  auto it = device.facts.find(key);
  return it == device.facts.end() ? "" : it->second;
}

// Attributes of one device, by name; each value one of {"string"}, {"int"}, {"bool"},
// {"version"} (DeviceAttribute: exactly one).
class Attributes {
 public:
  explicit Attributes(std::vector<std::string>* notes, const std::string& device)
      : notes_(notes), device_(device) {}

  void String(const char* name, const std::string& value) {
    if (value.empty()) return;
    if (value.size() > kMaxAttributeValueLength) {
      Note(name, absl::StrCat("\"", value, "\" is longer than 64 characters; cut"));
      values_[name] = json{{"string", value.substr(0, kMaxAttributeValueLength)}};
      return;
    }
    values_[name] = json{{"string", value}};
  }
  void Int(const char* name, int64_t value) { values_[name] = json{{"int", value}}; }
  void IntFrom(const char* name, const std::string& text) {
    int64_t value;
    if (!text.empty() && absl::SimpleAtoi(text, &value)) Int(name, value);
  }
  void Bool(const char* name, bool value) { values_[name] = json{{"bool", value}}; }
  void Version(const char* name, const std::string& text) {
    if (text.empty()) return;
    if (std::optional<std::string> version = SemanticVersion(text)) {
      values_[name] = json{{"version", *version}};
    } else {
      Note(name, absl::StrCat("\"", text, "\" is not a semantic version; left out"));
    }
  }
  json ToJson() const {
    json out = json::object();
    for (const auto& [name, value] : values_) out[name] = value;
    return out;
  }
  size_t size() const { return values_.size(); }

 private:
  void Note(const char* name, const std::string& why) {
    if (notes_ != nullptr) notes_->push_back(absl::StrCat(device_, ": attribute ", name, ": ", why));
  }
  std::vector<std::string>* notes_;
  const std::string device_;
  std::map<std::string, json> values_;
};

std::string EdgeTpuModel(const std::string& vendor, const std::string& product, bool usb) {
  if (vendor == "1ac1" && product == "089a") return "Coral M.2/PCIe Accelerator";
  if ((vendor == "18d1" && product == "9302") || (vendor == "1a6e" && product == "089a")) {
    return "Coral USB Accelerator";
  }
  return usb ? "Edge TPU (USB)" : "Edge TPU (PCIe)";
}

struct TaintKind {
  const char* key;
  const char* effect;
};

TaintKind KindOf(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kDeviceNodeMissing: return {kTaintDeviceNodeMissing, "NoExecute"};
    case ProblemKind::kNvmlXid: return {kTaintNvmlXid, "NoExecute"};
    case ProblemKind::kTemperature: return {kTaintTemperature, "NoSchedule"};
    case ProblemKind::kDriverStatus: return {kTaintDriverStatus, "NoSchedule"};
    case ProblemKind::kNvmlUnresponsive: return {kTaintNvmlUnresponsive, "NoSchedule"};
    case ProblemKind::kHeldElsewhere: return {kTaintHeldByDevicePlugin, "NoSchedule"};
    case ProblemKind::kOther: break;
  }
  return {kTaintUnhealthy, "NoSchedule"};
}

}  // namespace

std::string MebibyteQuantity(int64_t mib) {
  static constexpr const char* kSuffixes[] = {"Mi", "Gi", "Ti", "Pi", "Ei"};
  size_t suffix = 0;
  while (mib != 0 && mib % 1024 == 0 && suffix + 1 < std::size(kSuffixes)) {
    mib /= 1024;
    ++suffix;
  }
  return absl::StrCat(mib, kSuffixes[suffix]);
}

std::string TaintValue(absl::string_view detail) {
  absl::ConsumePrefix(&detail, "/dev/");
  std::string out;
  for (char c : detail) {
    out += absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '-';
  }
  if (out.size() > kMaxTaintValueLength) out.resize(kMaxTaintValueLength);
  size_t begin = 0;
  while (begin < out.size() && !absl::ascii_isalnum(static_cast<unsigned char>(out[begin]))) ++begin;
  size_t end = out.size();
  while (end > begin && !absl::ascii_isalnum(static_cast<unsigned char>(out[end - 1]))) --end;
  return out.substr(begin, end - begin);
}

json DeviceTaints(const Device& device) {
  json taints = json::array();
  if (device.health == Health::kHealthy) return taints;
  std::map<std::string, json> by_key;  // the first problem of each kind; sorted by key
  for (const HealthProblem& problem : device.problems) {
    const TaintKind kind = KindOf(problem.kind);
    if (by_key.count(kind.key) > 0) continue;
    json taint{{"key", kind.key}, {"effect", kind.effect}};
    if (std::string value = TaintValue(problem.detail); !value.empty()) taint["value"] = value;
    by_key[kind.key] = std::move(taint);
  }
  // Unhealthy for a reason no discoverer classified: still tainted, never offered untainted.
  if (by_key.empty()) by_key[kTaintUnhealthy] = json{{"key", kTaintUnhealthy}, {"effect", "NoSchedule"}};
  for (auto& [key, taint] : by_key) {
    if (taints.size() == kMaxTaintsPerDevice) break;
    taints.push_back(std::move(taint));
  }
  return taints;
}

json SliceDevice(const Device& device, std::vector<std::string>* notes, GpuSharing sharing) {
  const std::string name = DraDeviceName(device);
  Attributes attributes(notes, name);
  json capacity = json::object();
  bool shared = false;  // allowMultipleAllocations
  const std::string interface = Fact(device, "interface");
  if (device.numa_node.has_value()) attributes.Int("numaNode", *device.numa_node);
  if (!interface.empty()) {  // an Edge TPU
    const bool usb = interface == "usb";
    // PCIe Edge TPUs are Global Unichip's 1ac1:089a; the apex driver does not say so in sysfs
    // facts we keep, so a PCIe device without ids is taken to be that one.
    std::string vendor = Fact(device, "vendor_id");
    std::string product = Fact(device, "product_id");
    if (!usb && vendor.empty()) vendor = "1ac1";
    if (!usb && product.empty()) product = "089a";
    attributes.String("type", "edgetpu");
    attributes.String("model", EdgeTpuModel(vendor, product, usb));
    attributes.String("bus", usb ? "usb" : "pci");
    attributes.String("pciAddress", Fact(device, "pci_address"));
    attributes.String("usbPort", Fact(device, "usb_port"));
    attributes.String("vendorId", vendor);
    attributes.String("productId", product);
    attributes.Version("driverVersion", Fact(device, "driver_version"));
    attributes.Version("frameworkVersion", Fact(device, "framework_version"));
    auto threshold = device.telemetry.find("temperature_threshold_celsius");
    if (threshold != device.telemetry.end() && std::isfinite(threshold->second)) {
      attributes.Int("temperatureThresholdCelsius",
                     static_cast<int64_t>(std::floor(threshold->second)));
    }
  } else {
    const bool integrated = !Fact(device, "soc").empty();
    attributes.String("type", "gpu");
    attributes.Bool("integrated", integrated);
    if (integrated) {
      attributes.String("soc", Fact(device, "soc"));
      attributes.String("model", Fact(device, "model"));
      attributes.String("gpu", Fact(device, "gpu"));
      attributes.Version("l4tVersion", Fact(device, "l4t_release"));
    } else {
      attributes.String("uuid", Fact(device, "uuid"));
      attributes.String("productName", Fact(device, "model"));
      attributes.String("pciAddress", Fact(device, "pci_address"));
      attributes.IntFrom("minor", Fact(device, "minor"));
      attributes.Version("driverVersion", Fact(device, "driver_version"));
    }
    attributes.Version("computeCapability", Fact(device, "compute_capability"));
    int64_t memory_mib;
    const bool memory = absl::SimpleAtoi(Fact(device, "memory_mib"), &memory_mib) && memory_mib > 0;
    if (memory) capacity["memory"] = json{{"value", MebibyteQuantity(memory_mib)}};
    if (integrated ? sharing.integrated : sharing.discrete) {
      if (memory) {
        // ValidateResourceSlice (validateRequestPolicy): a validRange needs a default within
        // it and a min no larger than the value; 1Mi <= default == value.
        capacity["memory"]["requestPolicy"] =
            json{{"default", MebibyteQuantity(memory_mib)}, {"validRange", {{"min", kDraMinimumShare}}}};
        shared = true;
      } else if (notes != nullptr) {
        notes->push_back(absl::StrCat(name, ": not shared (--dra-shared): its memory is not known (a "
                                            "discrete GPU's comes from NVML), and claims share a GPU "
                                            "by parts of its memory"));
      }
    }
  }
  json out{{"name", name}, {"attributes", attributes.ToJson()}};
  if (!capacity.empty()) out["capacity"] = capacity;
  if (shared) out["allowMultipleAllocations"] = true;
  return out;
}

json SliceDevices(const Snapshot& snapshot, std::vector<std::string>* notes,
                  UnhealthyDevices unhealthy, GpuSharing sharing) {
  std::map<std::string, json> by_name;
  absl::flat_hash_set<std::string> physical;
  bool tainted = false;
  for (const Device& device : snapshot.devices) {
    if (device.health != Health::kHealthy && unhealthy == UnhealthyDevices::kLeftOut) continue;
    if (!physical.insert(PhysicalId(device)).second) continue;  // replicas: one device
    json entry = SliceDevice(device, notes, sharing);
    if (json taints = DeviceTaints(device); !taints.empty()) {
      entry["taints"] = std::move(taints);
      tainted = true;
    }
    const std::string name = entry["name"].get<std::string>();
    if (by_name.count(name) > 0) {
      if (notes != nullptr) notes->push_back(absl::StrCat(name, ": two devices give this name; the second is left out"));
      continue;
    }
    by_name[name] = std::move(entry);
  }
  json devices = json::array();
  const size_t max = tainted ? kResourceSliceMaxDevicesWithTaints : kResourceSliceMaxDevices;
  for (auto& [name, entry] : by_name) {
    if (devices.size() == max) {
      if (notes != nullptr) notes->push_back(absl::StrCat("more than ", max, " devices: the rest are left out"));
      break;
    }
    devices.push_back(std::move(entry));
  }
  return devices;
}

json ResourceSliceObject(absl::string_view driver, absl::string_view node_name,
                         absl::string_view node_uid, int64_t generation, const json& devices) {
  json metadata{{"generateName", absl::StrCat(node_name, "-", driver, "-")}};
  if (!node_uid.empty()) {
    metadata["ownerReferences"] = json::array({json{{"apiVersion", "v1"},
                                                    {"kind", "Node"},
                                                    {"name", std::string(node_name)},
                                                    {"uid", std::string(node_uid)},
                                                    {"controller", true}}});
  }
  return json{{"apiVersion", "resource.k8s.io/v1"},
              {"kind", "ResourceSlice"},
              {"metadata", metadata},
              {"spec",
               {{"driver", std::string(driver)},
                {"nodeName", std::string(node_name)},
                {"pool",
                 {{"name", std::string(node_name)},
                  {"generation", generation},
                  {"resourceSliceCount", 1}}},
                {"devices", devices}}}};
}

}  // namespace edgeaccel
