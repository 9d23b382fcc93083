// Other device plugins on this node: is a resource we would register already served by another
// socket? Registering it anyway would take it over (the kubelet keeps the last registration),
// and the other plugin would take it back at its next registration: a war nobody wins.
#ifndef EDGEACCEL_KUBELET_OTHER_PLUGINS_H_
#define EDGEACCEL_KUBELET_OTHER_PLUGINS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace edgeaccel {

struct OtherPlugin {
  std::string socket;        // its path, as this process sees it
  std::string registration;  // "kubelet" (device-plugins/) or "plugin-watcher" (plugins_registry/)
  std::string evidence;      // how we know it serves the resource, for the log
};

struct OtherPluginQuery {
  std::string resource;
  std::string device_plugin_dir;
  std::string plugins_registry_dir;
  std::string own_socket_name;       // ours: skipped in both directories
  std::vector<std::string> own_ids;  // the ids we advertise (or would) for the resource
  // The ids the kubelet holds for the resource (RegisteredDevices in its checkpoint).
  std::vector<std::string> kubelet_ids;
  absl::Duration timeout = absl::Milliseconds(500);  // for each socket's answer
};

// The first live socket other than ours and kubelet.sock that serves `query.resource`:
//  * in plugins_registry/, one whose GetInfo names the resource;
//  * in device-plugins/, one whose ListAndWatch advertises a device the kubelet holds for the
//    resource (`kubelet_ids`) or one of our own devices (the same physical
//    device served twice). The DevicePlugin API has no call that names a plugin's resource:
//    the device ids are what tie a socket to it.
// A socket that does not answer within the timeout (a hung or half-dead plugin) does not count,
// and never holds us up for longer than that.
std::optional<OtherPlugin> FindOtherPlugin(const OtherPluginQuery& query);

// Holds a ListAndWatch stream open to another plugin while we leave a resource to it, and
// writes to `notify_fd` (an eventfd) when the stream ends: the plugin exited, crashed or
// restarted. That is the only way to hear of it: a killed plugin leaves its socket file behind,
// and no inotify event comes.
class OtherPluginWatch {
 public:
  OtherPluginWatch(const std::string& socket, int notify_fd);
  ~OtherPluginWatch();  // cancels the stream and waits for gRPC to let go of it
  OtherPluginWatch(const OtherPluginWatch&) = delete;
  OtherPluginWatch& operator=(const OtherPluginWatch&) = delete;

 private:
  class Reactor;
  std::unique_ptr<Reactor> reactor_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_OTHER_PLUGINS_H_
