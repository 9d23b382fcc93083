// gRPC's iomgr timers (call deadlines, connect and handshake timeouts, reconnect backoff) on the
// one event-engine thread of ours, and no resolver executor: gRPC's threads no longer depend on the
// node, and an idle daemon's gRPC never wakes.
//
// gRPC 1.51 keeps iomgr timers apart from its EventEngine: two `grpc_global_timer` threads check
// them, and each wakes at least once a second even when no timer is pending (an empty shard's
// deadline is the end of its 1 s queue window: MAX_QUEUE_WINDOW_DURATION in
// src/core/lib/iomgr/timer_generic.cc). No option or environment variable changes that. What
// gRPC does offer, for its own fork support and tests, is a timer implementation that can be
// replaced before grpc_init (grpc_set_timer_impl), timer threads that can be turned off
// (grpc_timer_manager_set_threading) with one check run on demand (grpc_timer_manager_tick),
// and executor threads that can be turned off (Executor::SetThreadingAll), after which their
// closures run on the thread that scheduled them: done for the resolver executor (DNS, which
// Unix-socket targets never use), not for the default one (it runs a poller that blocks). None of these are in gRPC's public headers:
// this module declares them by their symbol names, for gRPC 1.51 only (Debian 12's), and does
// nothing at all when built against another version (docs/footprint.md).
#ifndef EDGEACCEL_KUBELET_GRPC_TIMERS_H_
#define EDGEACCEL_KUBELET_GRPC_TIMERS_H_

#include <grpc/event_engine/event_engine.h>

#include <string>

namespace edgeaccel {

// Puts gRPC's timers on `engine` (which must outlive the process's gRPC: the one from
// UseOneThreadGrpcEventEngine does) and turns gRPC's timer threads and resolver executor off. Call once,
// before anything of gRPC is made: it calls grpc_init itself and keeps that reference for the
// process's life (so the threads cannot come back with a later grpc_init), giving it back at exit. Returns what it did,
// for the log; when gRPC is not the version this was written for, says so and changes nothing.
std::string RunGrpcTimersOn(grpc_event_engine::experimental::EventEngine* engine);

// Timers pending in the replaced implementation now (tests; 0 when it is not in use).
int PendingGrpcTimers();

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_GRPC_TIMERS_H_
