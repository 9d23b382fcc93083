// Configure-time proof for kubelet/grpc_timers (cmake/grpc_internals.cmake builds this with the
// module's own sources and runs it; exit 0 turns the module on). The module declares gRPC
// internals by their symbol names and reads gRPC's timer structs by an assumed layout. Linking
// proves the symbols; this program proves the layouts and the behaviour, through gRPC's public API
// only, the way the daemon uses them:
//   - a call's deadline goes through our timer list (one timer pending while the call waits) and
//     ends the call with DEADLINE_EXCEEDED at its time, not before and not long after;
//   - a cancelled call's timer leaves our list at once;
//   - gRPC's own timer threads never start.
// A wrong deadline field would fire too early or too late; a wrong closure field would crash or
// never end the call. Each failure exits with its own code and says why.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "edgeaccel/kubelet/grpc_event_engine.h"
#include "edgeaccel/kubelet/grpc_timers.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int Fail(int code, const std::string& why) {
  std::fprintf(stderr, "grpc_timers probe: %s\n", why.c_str());
  return code;
}

bool ThreadNamed(const std::string& prefix) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* entry = readdir(dir)) {
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind(prefix, 0) == 0) found = true;
  }
  closedir(dir);
  return found;
}

// A call on a socket that takes connections and never speaks: only its deadline or a cancel ends
// it.
struct PendingCall {
  grpc::ClientContext context;
  grpc::ByteBuffer request, response;
  std::promise<grpc::Status> done;
};

void Start(grpc::GenericStub& stub, PendingCall& call) {
  grpc::Slice empty("");
  call.request = grpc::ByteBuffer(&empty, 1);  // an empty message: a Clear()ed buffer is no message
  stub.UnaryCall(&call.context, "/probe.Probe/Wait", grpc::StubOptions(), &call.request,
                 &call.response, [&call](grpc::Status status) { call.done.set_value(status); });
}

bool WaitForPending(int n) {
  const auto until = Clock::now() + milliseconds(2000);
  while (edgeaccel::PendingGrpcTimers() < n) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

}  // namespace

int main() {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", 0);
  const std::string said = edgeaccel::RunGrpcTimersOn(edgeaccel::UseOneThreadGrpcEventEngine());
  if (said.find("timers on the event engine") == std::string::npos) return Fail(10, said);

  char dir_template[] = "/tmp/edgeaccel-grpc-probe.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Fail(11, "mkdtemp failed");
  const std::string path = std::string(dir_template) + "/hung.sock";
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 16) != 0) {
    return Fail(12, "cannot listen on " + path);
  }
  int result = 0;
  {
    grpc::GenericStub stub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));

    // A deadline fires at its time through our list.
    PendingCall timed;
    timed.context.set_deadline(std::chrono::system_clock::now() + milliseconds(300));
    const auto started = Clock::now();
    Start(stub, timed);
    auto timed_done = timed.done.get_future();
    if (!WaitForPending(1)) {
      result = Fail(20, "a call's deadline did not reach the replaced timer list");
    } else if (timed_done.wait_for(milliseconds(3000)) != std::future_status::ready) {
      result = Fail(21, "a call's deadline did not end the call (its closure never ran)");
    } else {
      const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - started).count();
      const grpc::Status status = timed_done.get();
      if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        result = Fail(22, "the call ended with " + std::to_string(status.error_code()) +
                              ", not DEADLINE_EXCEEDED");
      } else if (took < 280 || took > 1500) {
        result = Fail(23, "a 300 ms deadline ended the call after " + std::to_string(took) + " ms");
      }
    }

    // A cancelled call's timer leaves the list at once.
    if (result == 0) {
      // Timers of the connection attempt (its handshake deadline) may be pending too.
      const int before = edgeaccel::PendingGrpcTimers();
      PendingCall cancelled;
      cancelled.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      Start(stub, cancelled);
      if (!WaitForPending(before + 1)) {
        result = Fail(30, "a second call's deadline did not reach the replaced timer list");
      } else {
        cancelled.context.TryCancel();
        auto done = cancelled.done.get_future();
        if (done.wait_for(milliseconds(3000)) != std::future_status::ready) {
          result = Fail(31, "a cancelled call did not end");
        } else if (done.get().error_code() != grpc::StatusCode::CANCELLED) {
          result = Fail(32, "a cancelled call did not end CANCELLED");
        } else {
          const auto until = Clock::now() + milliseconds(2000);
          while (edgeaccel::PendingGrpcTimers() > before && Clock::now() < until) {
            std::this_thread::sleep_for(milliseconds(2));
          }
          if (edgeaccel::PendingGrpcTimers() > before) {
            result = Fail(33, "a cancelled call's timer stayed in the list");
          }
        }
      }
    }
    if (result == 0 && ThreadNamed("grpc_global_tim")) {
      result = Fail(40, "gRPC's own timer threads started");
    }
  }
  close(listener);
  unlink(path.c_str());
  rmdir(dir_template);
  if (result == 0) std::printf("grpc_timers probe: passed\n");
  return result;
}
