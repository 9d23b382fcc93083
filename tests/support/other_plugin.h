// Another vendor's device plugin on the node: a real DevicePlugin server on its own socket in
// device-plugins/, registered through kubelet.sock as most plugins (NVIDIA's among them) do.
#ifndef EDGEACCEL_TESTS_SUPPORT_OTHER_PLUGIN_H_
#define EDGEACCEL_TESTS_SUPPORT_OTHER_PLUGIN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "edgeaccel/kubelet/plugin_server.h"

namespace edgeaccel::testing {

class OtherPlugin {
 public:
  // Serves `ids` of `resource` on <device_plugin_dir>/<socket_name>.
  OtherPlugin(const std::string& device_plugin_dir, const std::string& socket_name,
              const std::string& resource, const std::vector<std::string>& ids);
  // Starts serving and registers with the kubelet.sock in its directory.
  absl::Status Start();
  // Exits cleanly: its stream ends and its socket goes.
  void Stop() { server_.Stop(); }
  const std::string& socket() const { return socket_; }

 private:
  const std::string directory_;
  const std::string socket_name_;
  const std::string socket_;
  DeviceSet set_;
  PluginCounters counters_;
  PluginServer server_;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_OTHER_PLUGIN_H_
