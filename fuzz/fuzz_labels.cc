// Node labels and the NFD writer: whatever facts discovery read from the host (model strings,
// driver versions, compute capabilities, ids: all host-file content), every derived label is a
// valid Kubernetes label (the API server refuses the whole PATCH otherwise), and the NFD
// feature file written from them reads back as exactly the same labels.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/node/node_labels.h"
#include "edgeaccel/node/nfd_feature_file.h"

namespace {

bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

// [A-Za-z0-9._-]{0,63}, starting and ending alphanumeric when not empty.
bool ValidValue(absl::string_view v) {
  if (v.size() > 63) return false;
  if (v.empty()) return true;
  if (!IsAlnum(v.front()) || !IsAlnum(v.back())) return false;
  for (char c : v) {
    if (!IsAlnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

// prefix/name: the prefix a DNS subdomain of at most 253 characters, the name a non-empty
// label value.
bool ValidKey(absl::string_view key) {
  const size_t slash = key.find('/');
  absl::string_view name = key;
  if (slash != absl::string_view::npos) {
    absl::string_view prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (prefix.empty() || prefix.size() > 253) return false;
    for (char c : prefix) {
      if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
            absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-')) {
        return false;
      }
    }
  }
  return !name.empty() && ValidValue(name);
}

const std::string& Directory() {
  static const std::string* dir = [] {
    char tmpl[] = "/tmp/edgeaccel-fuzz-labels-XXXXXX";
    return new std::string(mkdtemp(tmpl));
  }();
  return *dir;
}

const char* const kResources[] = {"coral.ai/edgetpu", "nvidia.com/gpu"};
const char* const kFacts[] = {"model", "driver_version", "memory_mib", "compute_capability",
                              "vendor_id", "product_id", "soc", "interface", "l4t_release"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  std::map<std::string, std::shared_ptr<const edgeaccel::Snapshot>> snapshots;
  for (const char* resource : kResources) {
    auto snapshot = std::make_shared<edgeaccel::Snapshot>();
    const int count = input.ConsumeIntegralInRange(0, 3);
    for (int i = 0; i < count; ++i) {
      edgeaccel::Device device;
      device.id = "dev" + std::to_string(i);
      if (input.ConsumeBool()) device.replica_of = "dev0";
      for (const char* fact : kFacts) {
        if (input.ConsumeBool()) device.facts[fact] = input.ConsumeRandomLengthString(80);
      }
      snapshot->devices.push_back(std::move(device));
    }
    snapshots[resource] = std::move(snapshot);
  }
  edgeaccel::LabelOptions options;
  options.seed_labels = input.ConsumeBool();

  const std::string raw = input.ConsumeRemainingBytesAsString();
  const std::string clean = edgeaccel::SanitizeLabelValue(raw);
  if (!ValidValue(clean)) __builtin_trap();
  if (edgeaccel::SanitizeLabelValue(clean) != clean) __builtin_trap();  // idempotent

  const edgeaccel::LabelSet labels = edgeaccel::DeriveLabels(snapshots, options);
  for (const auto& [key, value] : labels) {
    if (!ValidKey(key) || !ValidValue(value)) {
      fprintf(stderr, "invalid label %s=%s\n", key.c_str(), value.c_str());
      __builtin_trap();
    }
  }

  if (absl::Status written = edgeaccel::WriteNfdFeatureFile(Directory(), labels); !written.ok()) {
    fprintf(stderr, "%s\n", written.ToString().c_str());
    __builtin_trap();
  }
  std::ifstream file(Directory() + "/edgeaccel");
  edgeaccel::LabelSet read_back;
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) __builtin_trap();
    if (!read_back.emplace(line.substr(0, eq), line.substr(eq + 1)).second) __builtin_trap();
  }
  if (read_back != labels) __builtin_trap();
  return 0;
}
