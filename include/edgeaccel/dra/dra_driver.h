// The DRA driver's names: which driver publishes a family, what a device is called in its pool,
// and the values DRA's types accept (semantic versions, DNS labels). docs/dra.md has the tables.
#ifndef EDGEACCEL_DRA_DRA_DRIVER_H_
#define EDGEACCEL_DRA_DRA_DRIVER_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "edgeaccel/discovery/device.h"

namespace edgeaccel {

inline constexpr absl::string_view kDraEdgeTpuDriver = "edgetpu.edgeaccel.io";
inline constexpr absl::string_view kDraGpuDriver = "gpu.edgeaccel.io";

// The driver that publishes a family's devices (coral-pcie and coral-usb: edgetpu.edgeaccel.io;
// tegra and nvidia: gpu.edgeaccel.io); empty for an unknown family.
std::string DraDriverForFamily(absl::string_view family);

// Where the kubelet looks for a driver's plugin (<kubelet-root>/plugins/<driver>): its service
// socket dra.sock, and our checkpoint of the claims it prepared.
std::string DraPluginDir(absl::string_view kubelet_root, absl::string_view driver);
// The service socket's name in that directory.
inline constexpr absl::string_view kDraServiceSocketName = "dra.sock";

// The device's name in its pool: a DNS label (at most 63 characters of [a-z0-9-], alphanumeric
// at both ends) made from its stable physical id, with a prefix for its kind ("tpu-",
// "tpu-usb-", "gpu-"), so it is the same across restarts and re-plugs.
std::string DraDeviceName(const Device& device);

// `text` as a semantic version 2.0 (MAJOR.MINOR.PATCH, no leading zeros): "1.2" -> "1.2.0",
// "580.159.04" -> "580.159.4", "36.4.7" -> itself. Nothing when it has no such reading.
std::optional<std::string> SemanticVersion(absl::string_view text);

// Whether `name` is a DNS label (RFC 1123): what ResourceSlice device names must be.
bool IsDnsLabel(absl::string_view name);

// Whether `uid` is a claim UID as the API server makes them (metadata.uid: an RFC 4122 UUID in
// its text form, 36 characters of lowercase hex and dashes, 8-4-4-4-12). Spec and checkpoint
// names are built from claim UIDs, so nothing else is ever taken for one.
bool IsClaimUid(absl::string_view uid);

// The CDI kind of a driver's claim devices ("k8s.edgetpu.edgeaccel.io/claim"), the spec file's
// name for a claim ("k8s.edgetpu.edgeaccel.io-claim_<uid>.json") and a device's CDI id in it
// ("k8s.edgetpu.edgeaccel.io/claim=<uid>-<device>"). The claim UID makes every name new: a
// runtime that cached an old spec never resolves a new claim to it.
std::string DraCdiKind(absl::string_view driver);
std::string DraCdiSpecFileName(absl::string_view driver, absl::string_view claim_uid);
std::string DraCdiDeviceId(absl::string_view driver, absl::string_view claim_uid,
                           absl::string_view device_name);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRA_DRIVER_H_
