#include "edgeaccel/dra/dra_driver.h"

#include <cctype>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace edgeaccel {

std::string DraPluginDir(absl::string_view kubelet_root, absl::string_view driver) {
  return absl::StrCat(kubelet_root, "/plugins/", driver);
}

std::string DraDriverForFamily(absl::string_view family) {
  if (family == "coral-pcie" || family == "coral-usb") return std::string(kDraEdgeTpuDriver);
  if (family == "tegra" || family == "nvidia") return std::string(kDraGpuDriver);
  return "";
}

std::string DraDeviceName(const Device& device) {
  const std::string& id = PhysicalId(device);
  std::string prefix;
  absl::string_view rest = id;
  auto fact = device.facts.find("interface");
  const bool tpu = fact != device.facts.end();
  if (tpu) {
    prefix = fact->second == "usb" ? "tpu-usb-" : "tpu-";
  } else {
    prefix = "gpu-";
    if (absl::StartsWith(rest, "GPU-")) rest.remove_prefix(4);  // discrete: the UUID's hex
  }
  std::string name = prefix;
  for (char c : rest) {
    const char lower = absl::ascii_tolower(static_cast<unsigned char>(c));
    name += (absl::ascii_isalnum(static_cast<unsigned char>(lower))) ? lower : '-';
  }
  if (name.size() > 63) name.resize(63);
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name;
}

std::optional<std::string> SemanticVersion(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return std::nullopt;
  std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  if (parts.size() > 3) return std::nullopt;
  std::vector<std::string> numbers;
  for (absl::string_view part : parts) {
    if (part.empty() || part.size() > 18) return std::nullopt;
    for (char c : part) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    }
    uint64_t value = 0;
    if (!absl::SimpleAtoi(part, &value)) return std::nullopt;
    numbers.push_back(absl::StrCat(value));
  }
  while (numbers.size() < 3) numbers.push_back("0");
  std::string version = absl::StrCat(numbers[0], ".", numbers[1], ".", numbers[2]);
  if (version.size() > 64) return std::nullopt;
  return version;
}

bool IsDnsLabel(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return false;
    }
  }
  return name.front() != '-' && name.back() != '-';
}

bool IsClaimUid(absl::string_view uid) {
  if (uid.size() != 36) return false;
  for (size_t i = 0; i < uid.size(); ++i) {
    const char c = uid[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) {
      return false;
    }
  }
  return true;
}

std::string DraCdiKind(absl::string_view driver) { return absl::StrCat("k8s.", driver, "/claim"); }

std::string DraCdiSpecFileName(absl::string_view driver, absl::string_view claim_uid) {
  return absl::StrCat("k8s.", driver, "-claim_", claim_uid, ".json");
}

std::string DraCdiDeviceId(absl::string_view driver, absl::string_view claim_uid,
                           absl::string_view device_name) {
  return absl::StrCat(DraCdiKind(driver), "=", claim_uid, "-", device_name);
}

}  // namespace edgeaccel
