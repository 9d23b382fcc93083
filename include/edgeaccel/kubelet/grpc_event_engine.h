// gRPC's deferred work and timers on one thread of ours, whatever the core count.
//
// gRPC 1.51's own EventEngine (PosixEventEngine) starts clamp(cores, 2, 32) worker threads, all
// at once, plus a "timer_manager" thread that wakes once a second even with no timer pending
// (posix_engine/timer.cc: an empty shard's deadline is the queue window's end, at most 1 s out;
// grpc/grpc#19947). On a 16-core node that was 17 threads and a wake-up a second for a daemon that
// is idle almost all the time. In 1.51 the core asks its EventEngine only to Run work now, to
// RunAfter a delay (subchannel reconnect backoff, for instance) and to Cancel that; connections
// and name resolution still go through iomgr. So one thread that sleeps until the next deadline,
// with no deadline at all when nothing is pending, does all of it (docs/footprint.md).
#ifndef EDGEACCEL_KUBELET_GRPC_EVENT_ENGINE_H_
#define EDGEACCEL_KUBELET_GRPC_EVENT_ENGINE_H_

#include <grpc/event_engine/event_engine.h>

#include <memory>
#include <string>

namespace edgeaccel {

// An EventEngine that runs every closure on one thread named `thread_name`, timers at their
// exact deadline. Connect, CreateListener and GetDNSResolver are not offered (gRPC 1.51 does not
// use them: connections go through iomgr); Connect answers Unimplemented, asynchronously, as the
// interface requires.
std::unique_ptr<grpc_event_engine::experimental::EventEngine> MakeOneThreadEventEngine(
    std::string thread_name);

// Both return nullptr, and gRPC keeps its own engine, where the build found that this engine does
// not fit the installed gRPC's EventEngine interface (cmake/grpc_internals.cmake).
//
// Makes gRPC use one process-wide engine of that kind ("ea-grpc-timer"), and returns it (the
// same one on every call; it lives as long as the process). Call before the first gRPC channel or
// server is made (and before grpc_init): an engine made earlier stays gRPC's.
grpc_event_engine::experimental::EventEngine* UseOneThreadGrpcEventEngine();

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_GRPC_EVENT_ENGINE_H_
