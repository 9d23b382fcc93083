#include "edgeaccel/node/node_labels.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/discovery/resource_names.h"

namespace edgeaccel {
namespace {

// Physical devices only: replicas describe sharing, not hardware.
std::vector<const Device*> Physical(const Snapshot& snapshot) {
  std::vector<const Device*> out;
  std::set<std::string> seen;
  for (const Device& d : snapshot.devices) {
    if (seen.insert(PhysicalId(d)).second) out.push_back(&d);
  }
  return out;
}

std::string Fact(const Device& d, const std::string& key) {
  auto it = d.facts.find(key);
  return it == d.facts.end() ? std::string() : it->second;
}

// GPU architecture family from the CUDA compute capability (GFD's names).
std::string Family(int major, int minor) {
  switch (major) {
    case 3:
      return "kepler";
    case 5:
      return "maxwell";
    case 6:
      return "pascal";
    case 7:
      return minor >= 5 ? "turing" : "volta";
    case 8:
      return minor == 9 ? "ada-lovelace" : "ampere";
    case 9:
      return "hopper";
    case 10:
    case 11:
    case 12:
      return "blackwell";
  }
  return "undefined";
}

void Set(LabelSet* labels, const std::string& key, absl::string_view value) {
  std::string clean = SanitizeLabelValue(value);
  if (!clean.empty()) (*labels)[key] = clean;
}

// <prefix>.memory, .compute.major, .compute.minor and .family from one GPU's facts (prefix
// "nvidia.com/gpu" for the node's, "nvidia.com/gpu-<product>" for one product's).
void SetGpuFacts(LabelSet* labels, const std::string& prefix, const Device& gpu) {
  Set(labels, prefix + ".memory", Fact(gpu, "memory_mib"));
  std::vector<std::string> cc = absl::StrSplit(Fact(gpu, "compute_capability"), '.');
  int major = 0, minor = 0;
  if (cc.size() == 2 && absl::SimpleAtoi(cc[0], &major) && absl::SimpleAtoi(cc[1], &minor) &&
      major >= 0 && minor >= 0) {
    // The numbers as parsed: SimpleAtoi takes " 2" and "2 ", which are no label values.
    (*labels)[prefix + ".compute.major"] = absl::StrCat(major);
    (*labels)[prefix + ".compute.minor"] = absl::StrCat(minor);
    (*labels)[prefix + ".family"] = Family(major, minor);
  }
}

}  // namespace

std::string SanitizeLabelValue(absl::string_view value) {
  std::string out;
  for (char c : value) {
    const bool ok = absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
    if (ok) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');  // spaces and the like: one dash
    }
  }
  auto trim = [](std::string& s) {
    while (!s.empty() && !absl::ascii_isalnum(s.back())) s.pop_back();
    size_t start = 0;
    while (start < s.size() && !absl::ascii_isalnum(s[start])) ++start;
    s.erase(0, start);
  };
  trim(out);
  if (out.size() > 63) {
    out.resize(63);
    trim(out);
  }
  return out;
}

LabelSet DeriveLabels(const std::map<std::string, std::shared_ptr<const Snapshot>>& snapshots,
                      const LabelOptions& options) {
  LabelSet labels;
  std::string seed_model, seed_driver, seed_resource, seed_vendor, seed_product;

  auto gpus = snapshots.find(std::string(kResourceNvidiaGpu));
  if (gpus != snapshots.end() && !gpus->second->devices.empty()) {
    const Snapshot& snapshot = *gpus->second;
    std::vector<const Device*> physical = Physical(snapshot);
    const Device& first = *physical.front();
    labels["nvidia.com/gpu.present"] = "true";
    labels["nvidia.com/gpu.count"] = absl::StrCat(physical.size());
    labels["nvidia.com/gpu.replicas"] = absl::StrCat(snapshot.devices.size() / physical.size());
    Set(&labels, "nvidia.com/gpu.product", Fact(first, "model"));
    SetGpuFacts(&labels, "nvidia.com/gpu", first);
    // From NVML (discrete GPUs): the CUDA version the driver supports, and ECC.
    std::vector<std::string> cuda = absl::StrSplit(Fact(first, "cuda_version"), '.');
    if (cuda.size() == 2) {
      Set(&labels, "nvidia.com/cuda.runtime.major", cuda[0]);
      Set(&labels, "nvidia.com/cuda.runtime.minor", cuda[1]);
    }
    const std::string ecc = Fact(first, "ecc_enabled");
    if (!ecc.empty()) labels["nvidia.com/gpu.ecc"] = ecc == "true" ? "enabled" : "disabled";
    // Where the GPUs are not all the same product, each product's own facts.
    std::map<std::string, std::vector<const Device*>> by_product;
    for (const Device* d : physical) by_product[SanitizeLabelValue(Fact(*d, "model"))].push_back(d);
    if (by_product.size() > 1) {
      for (const auto& [product, devices] : by_product) {
        if (product.empty()) continue;
        // A key's name part (after "nvidia.com/") is 63 characters at most; the longest here is
        // "gpu-<product>.compute.major".
        if (4 + product.size() + 14 > 63) continue;
        const std::string prefix = absl::StrCat("nvidia.com/gpu-", product);
        labels[prefix + ".count"] = absl::StrCat(devices.size());
        SetGpuFacts(&labels, prefix, *devices.front());
      }
    }
    const std::string driver = Fact(first, "driver_version");
    if (!driver.empty()) {
      std::vector<std::string> parts = absl::StrSplit(driver, '.');
      const char* names[] = {"nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                             "nvidia.com/cuda.driver.rev"};
      for (size_t i = 0; i < parts.size() && i < 3; ++i) Set(&labels, names[i], parts[i]);
    }
    const std::string l4t = Fact(first, "l4t_release");
    if (!Fact(first, "soc").empty() || !l4t.empty()) {
      Set(&labels, "nvidia.com/jetson.board", Fact(first, "model"));
      Set(&labels, "nvidia.com/jetson.soc", Fact(first, "soc"));
      Set(&labels, "nvidia.com/jetson.l4t.release", l4t);
      Set(&labels, "nvidia.com/jetson.l4t.major", Fact(first, "l4t_major"));
      seed_model = Fact(first, "model");
      seed_driver = l4t;  // the whole L4T release, e.g. 32.5.1, not just "5.1"
      seed_resource = "tegrastats";
    } else {
      seed_model = Fact(first, "model");
      seed_driver = driver;
      seed_resource = "nvidia-smi";
    }
  }

  // MIG, from every GPU NVML lists: a GPU in MIG mode is not advertised, but is on the node.
  if (!options.nvml_gpus.empty()) {
    bool capable = false;
    int enabled = 0, disabled = 0;
    for (const auto& gpu : options.nvml_gpus) {
      auto it = gpu.find("mig_capable");
      capable |= it != gpu.end() && it->second == "true";
      it = gpu.find("mig_mode");
      if (it != gpu.end()) (it->second == "enabled" ? enabled : disabled)++;
    }
    labels["nvidia.com/mig.capable"] = capable ? "true" : "false";
    if (enabled + disabled > 0) {
      labels["nvidia.com/mig.mode"] = disabled == 0 ? "enabled" : enabled == 0 ? "disabled" : "mixed";
    }
  }

  auto tpus = snapshots.find(std::string(kResourceEdgeTpu));
  if (tpus != snapshots.end() && !tpus->second->devices.empty()) {
    std::vector<const Device*> physical = Physical(*tpus->second);
    std::set<std::string> interfaces;
    for (const Device* d : physical) interfaces.insert(Fact(*d, "interface"));
    labels["coral.ai/edgetpu.present"] = "true";
    labels["coral.ai/edgetpu.count"] = absl::StrCat(physical.size());
    std::string interface;
    for (const std::string& i : interfaces) interface += (interface.empty() ? "" : "-") + i;
    Set(&labels, "coral.ai/edgetpu.interface", interface);  // pcie, usb, or pcie-usb
    const Device& first = *physical.front();  // ids sort PCIe (0000:...) before USB ports
    Set(&labels, "coral.ai/edgetpu.driver-version", Fact(first, "driver_version"));
    Set(&labels, "coral.ai/edgetpu.vendor-id", Fact(first, "vendor_id"));
    Set(&labels, "coral.ai/edgetpu.product-id", Fact(first, "product_id"));
    if (seed_model.empty()) {
      seed_model = "Google-Coral-TPU";
      seed_vendor = Fact(first, "vendor_id");
      seed_product = Fact(first, "product_id");
    }
  }

  if (options.seed_labels && !seed_model.empty()) {
    Set(&labels, "gpu.model", seed_model);
    Set(&labels, "gpu.driver", seed_driver);
    Set(&labels, "gpu.resource", seed_resource);
    Set(&labels, "gpu.vendor.id", seed_vendor);
    Set(&labels, "gpu.product.id", seed_product);
  }
  return labels;
}

}  // namespace edgeaccel
