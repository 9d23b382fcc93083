// Configure-time proof (cmake/grpc_internals.cmake) of what dra/dra_grpc_server.cc relies on to
// tell which DRA driver's socket a call came in on: a connection handed to the server with
// grpc::AddInsecureChannelFromFd(server, fd) names its calls' peer "fd:<fd>". The string is
// ServerContext::peer()'s, a public call, but its format is gRPC's own choice
// (grpc_server_add_channel_from_fd), so it is checked against the installed gRPC rather than
// trusted. Exit 0 when it holds; otherwise 1 and what was seen, on stdout. Every wait is bounded.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include <grpcpp/create_channel_posix.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>

namespace {

using Clock = std::chrono::system_clock;

void* Tag(long n) { return reinterpret_cast<void*>(n); }
constexpr long kArrived = 1;         // the server's RequestCall
constexpr long kClientFinished = 2;  // the client's Finish
constexpr long kServerFinished = 3;  // the server's Finish

// The last bound, for a wait no deadline covers (a gRPC thread stuck in a system call): configure
// must not hang on the probe.
void OnAlarm(int) {
  static const char kMessage[] = "the probe did not finish within 30 s";
  (void)!write(STDOUT_FILENO, kMessage, sizeof(kMessage) - 1);
  _exit(1);
}

}  // namespace

int main() {
  signal(SIGALRM, OnAlarm);
  alarm(30);
  // Non-blocking, as dra_grpc_server.cc accepts its connections (accept4 with SOCK_NONBLOCK).
  // grpc_server_add_channel_from_fd uses the descriptor as it is: a blocking one leaves gRPC's
  // reader stuck in recvmsg() inside whichever thread polls (here, AsyncNext: no deadline helps).
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
    std::cout << "socketpair() failed";
    return 1;
  }
  // As dra_grpc_server.cc serves: the async API on a server with no listening port, one
  // completion queue, the connection added from its descriptor.
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::cout << "the server does not start";
    return 1;
  }
  const std::string want = "fd:" + std::to_string(fds[0]);
  grpc::AddInsecureChannelFromFd(server.get(), fds[0]);  // the server owns fds[0] from here
  grpc::GenericServerContext server_context;
  grpc::GenericServerAsyncReaderWriter stream(&server_context);
  service.RequestCall(&server_context, &stream, cq.get(), cq.get(), Tag(kArrived));

  // The client on the same completion queue, so that one AsyncNext loop drives both ends
  // whatever the polling engine.
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateInsecureChannelFromFd("probe", fds[1]);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(deadline);
  grpc::ByteBuffer request, response;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/probe.Probe/Peer", request, cq.get());
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, Tag(kClientFinished));

  std::string peer;
  bool arrived = false, client_finished = false, server_finished = false, timed_out = false;
  bool server_pending = true;  // the RequestCall, then the Finish, not yet completed
  while (!client_finished || server_pending) {
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        cq->AsyncNext(&tag, &ok, std::max(deadline, Clock::now()) + std::chrono::seconds(1));
    if (next != grpc::CompletionQueue::GOT_EVENT) {
      timed_out = true;
      break;
    }
    if (tag == Tag(kArrived)) {
      if (!ok) {
        server_pending = false;  // the server is shutting down: no call will come
        continue;
      }
      arrived = true;
      peer = server_context.peer();
      stream.Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "probe"), Tag(kServerFinished));
    } else if (tag == Tag(kServerFinished)) {
      server_finished = true;
      server_pending = false;
    } else if (tag == Tag(kClientFinished)) {
      client_finished = true;
      // The call ended without reaching the server (deadline, connection lost): stop waiting.
      if (!arrived) server->Shutdown(Clock::now());
    }
  }

  int result = 0;
  if (!arrived) {
    std::cout << "no call arrived at the server on the connection added from fd " << fds[0];
    if (client_finished) {
      std::cout << " (the client's call ended: " << status.error_code() << " "
                << status.error_message() << ")";
    } else if (timed_out) {
      std::cout << " (nothing completed within 11 s)";
    }
    result = 1;
  } else if (peer != want) {
    std::cout << "a connection added from fd " << fds[0] << " names its calls' peer \"" << peer
              << "\", not \"" << want << "\"";
    result = 1;
  }
  if (timed_out || !server_finished) {
    // Something is still pending: tearing the server and queue down could wait on it.
    std::cout.flush();
    std::_Exit(result);
  }

  server->Shutdown(Clock::now() + std::chrono::seconds(1));
  cq->Shutdown();
  const Clock::time_point drain_deadline = Clock::now() + std::chrono::seconds(5);
  while (true) {
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next = cq->AsyncNext(&tag, &ok, drain_deadline);
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    if (next == grpc::CompletionQueue::TIMEOUT) {
      std::cout.flush();
      std::_Exit(result);
    }
  }
  return result;
}
