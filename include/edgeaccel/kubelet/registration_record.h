// RegistrationRecord: whether this node's last registration of a resource was ours, kept on
// disk so that it outlives our process, a kubelet restart and a reboot.
//
// After a kubelet restart the kubelet forgets which plugin served a resource: its checkpoint
// keeps the resource's name with an empty list until a plugin registers it again. Our own
// record is what tells "ours, register at once" from "another plugin's, leave it to it while it
// comes back". One marker file per resource in <device-plugin-dir>/.edgeaccel/: the kubelet
// clears sockets (1.25+) or files (1.20-1.24) from device-plugins/ when it starts, but never
// directories, and the DaemonSet already mounts that directory.
//
// The marker also says how the registration was made ("kubelet" or "plugin-watcher"): an
// edgeaccel that registers through kubelet.sock after one that used the plugin watcher must first
// let the watcher unregister the old socket (registration_machine.h).
#ifndef EDGEACCEL_KUBELET_REGISTRATION_RECORD_H_
#define EDGEACCEL_KUBELET_REGISTRATION_RECORD_H_

#include <string>

#include "absl/status/status.h"

namespace edgeaccel {

inline constexpr char kRegistrationRecordDir[] = ".edgeaccel";

class RegistrationRecord {
 public:
  // `directory`: where the markers live ("" keeps the record in memory only).
  RegistrationRecord(std::string directory, std::string resource);

  // This node's last registration of the resource was ours.
  bool RegisteredLast() const;
  // How that registration was made, as Set() was told: "kubelet" or "plugin-watcher"; "" when
  // the record does not say (it is not ours, or an older edgeaccel wrote it without saying how).
  std::string RegisteredVia() const;
  // Records whether it is ours now, and how it is made. A failed write is returned (the record in
  // memory holds).
  absl::Status Set(bool ours, const std::string& via);

 private:
  const std::string directory_;
  const std::string path_;
  bool in_memory_ = false;
  std::string via_in_memory_;
  bool known_ = false;  // in_memory_ and via_in_memory_ are what we last set
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_REGISTRATION_RECORD_H_
