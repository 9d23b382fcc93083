// The kubelet's fixed names: API versions, its directories and socket names, and ours.
// One place, so they never drift apart.
#ifndef EDGEACCEL_KUBELET_KUBELET_API_H_
#define EDGEACCEL_KUBELET_KUBELET_API_H_

#include <string>

#include "absl/strings/string_view.h"

namespace edgeaccel {

// Device plugin API (k8s.io/kubelet deviceplugin v1beta1).
inline constexpr absl::string_view kDevicePluginApiVersion = "v1beta1";

// The kubelet's directories. plugins_registry/ lives under its --root-dir (default
// /var/lib/kubelet; microk8s: /var/snap/microk8s/common/var/lib/kubelet). device-plugins/ does
// not: the kubelet hard-codes /var/lib/kubelet/device-plugins/ (deviceplugin v1beta1
// DevicePluginPath), whatever its --root-dir.
inline constexpr absl::string_view kDefaultKubeletRoot = "/var/lib/kubelet";
inline constexpr absl::string_view kDefaultDevicePluginDir = "/var/lib/kubelet/device-plugins";
inline constexpr absl::string_view kPluginsRegistryDir = "plugins_registry";
inline constexpr absl::string_view kKubeletSocketName = "kubelet.sock";
inline constexpr absl::string_view kKubeletCheckpointName = "kubelet_internal_checkpoint";
// The pod-resources API's socket, under the kubelet's --root-dir.
inline constexpr absl::string_view kPodResourcesSocket = "pod-resources/kubelet.sock";

// Plugin watcher API (pluginregistration v1).
inline constexpr absl::string_view kPluginTypeDevicePlugin = "DevicePlugin";

// Our socket's file name for a resource: "coral.ai/edgetpu" -> "edgeaccel-coral.ai-edgetpu.sock".
// The plugin watcher ignores names starting with '.', and recommends <domain-ish name>.sock.
std::string SocketFileName(absl::string_view resource_name);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_KUBELET_API_H_
