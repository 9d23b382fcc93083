// edgeaccel-echo-floor: the floor a minimal gRPC server reaches. A bare synchronous echo
// service (gRPC's default ServerBuilder, no options) on a Unix socket, in its own process, linked
// from the same archives as the daemon. edgeaccel-bench measures the daemon's Allocate against it
// in one run.
//   edgeaccel-echo-floor SOCKET_PATH    (prints "ready" on stderr once it serves; stops on SIGTERM)
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "echo.grpc.pb.h"

namespace {

class EchoService final : public edgeaccel::bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const edgeaccel::bench::EchoMessage* request,
                    edgeaccel::bench::EchoMessage* response) override {
    *response = *request;
    return grpc::Status::OK;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: edgeaccel-echo-floor SOCKET_PATH\n");
    return 2;
  }
  unlink(argv[1]);
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("unix:") + argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    fprintf(stderr, "edgeaccel-echo-floor: cannot listen on %s\n", argv[1]);
    return 1;
  }
  fprintf(stderr, "ready\n");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown();
  unlink(argv[1]);
  return 0;
}
