// What PreStartContainer checks before every container start, restarts included.
//
// The kubelet admits a pod once, with one Allocate, and caches the answer in its checkpoint. A
// container that restarts later (it crashed, its liveness probe failed) is started from that
// cached answer, not from a new Allocate. If a device node in it is gone by then (a USB
// Accelerator that re-enumerated under a new device number, a TPU replugged at another index,
// a device unplugged), the runtime fails the start with a bare "no such file or directory", over
// and over. This check fails it first, naming the device and what changed, so the pod's events
// and our log say what happened and what to do.
#ifndef EDGEACCEL_KUBELET_CACHED_ALLOCATION_CHECK_H_
#define EDGEACCEL_KUBELET_CACHED_ALLOCATION_CHECK_H_

#include <string>

#include "edgeaccel/kubelet/plugin_options.h"

namespace edgeaccel {

// The pre-start hook for `resource`: every requested device must still exist and be Healthy,
// and every device node in the answer the kubelet cached for these devices (read from
// `checkpoint_path`) must still be one of theirs. An unreadable checkpoint or a container the
// checkpoint does not know skips the node check (never blocks a start on our parsing).
PreStartHook CachedAllocationCheck(std::string checkpoint_path, std::string resource);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_CACHED_ALLOCATION_CHECK_H_
