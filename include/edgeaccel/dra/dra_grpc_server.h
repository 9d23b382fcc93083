// DraGrpcServer: one gRPC server, answered by one loop thread ("ea-dra"), for every DRA driver of
// the daemon. gRPC registers a service once per server, and both drivers serve the same services
// (DRAPlugin, DRAResourceHealth, Registration), each on sockets of its own: so the server listens
// on no port itself. Each driver's listening sockets are accepted on a PollLoop (the daemon's
// ea-loop) and every connection is handed to the server (grpc::AddInsecureChannelFromFd), which
// names its peer "fd:<N>" after the descriptor. The server keeps which driver each descriptor was
// accepted for, and a call is answered by the driver its connection came in on (OwnerOf).
//
// Why one descriptor number never names two drivers' connections at once: gRPC closes an accepted
// descriptor only when its transport is destroyed, and the transport lives while any call on it
// does; a call's owner is looked up while the call lives, and a number is mapped anew only when
// accept() hands it out again, which it cannot while the earlier connection holds it.
#ifndef EDGEACCEL_DRA_DRA_GRPC_SERVER_H_
#define EDGEACCEL_DRA_DRA_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/dra_plugin_service.h"  // the services' namespaces
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {

class DraPluginServer;

class DraGrpcServer {
 public:
  // `accept_loop`: where the drivers' listening sockets are accepted (outlives this object); null:
  // a loop of this server's own ("ea-dra-accept").
  explicit DraGrpcServer(PollLoop* accept_loop = nullptr);
  ~DraGrpcServer();  // Stop()s
  DraGrpcServer(const DraGrpcServer&) = delete;
  DraGrpcServer& operator=(const DraGrpcServer&) = delete;

  // Builds and starts the server and its loop, once: the first driver that serves calls it, and
  // every later call answers as the first did.
  absl::Status Start();

  // What a driver serves its calls with (after Start).
  drav1::DRAPlugin::AsyncService* v1() const { return v1_.get(); }
  drav1beta1::DRAPlugin::AsyncService* v1beta1() const { return v1beta1_.get(); }
  drahealth::DRAResourceHealth::AsyncService* health() const { return health_.get(); }
  pluginregistration::Registration::AsyncService* registration() const {
    return registration_.get();
  }
  CompletionLoop* loop() const { return loop_.get(); }

  // Accepts connections on `listening` (non-blocking listening sockets `owner` keeps open until
  // it calls StopAccepting) and hands each to the server as `owner`'s. After Start.
  void Accept(DraPluginServer* owner, std::vector<int> listening);
  // No more connections for `owner`: when this returns, none is being accepted for it. Those it
  // has stay until Stop.
  void StopAccepting(DraPluginServer* owner);

  // The driver whose socket the call's connection came in on; null where none (a connection this
  // server did not accept).
  DraPluginServer* OwnerOf(const grpc::ServerContext& context) const;
  // The answer to a call whose owner is null (it cannot happen: every connection is one a
  // driver's socket accepted), said in the log.
  static grpc::Status NoOwner(const grpc::ServerContext& context);

  // Shuts the server down, giving calls `grace` to end, drains the loop, runs `drained` (where the
  // drivers join the threads still answering calls, whose answers now go nowhere) and waits for
  // the server to end. Every driver must have stopped accepting.
  void Stop(absl::Duration grace = absl::Milliseconds(500),
            const std::function<void()>& drained = nullptr);

 private:
  class Acceptor;

  // Takes a connection accepted for `owner`: maps its descriptor to it, hands it to the server.
  void Adopt(int fd, DraPluginServer* owner);

  PollLoop* accept_loop_;
  std::unique_ptr<PollLoop> own_accept_loop_;
  std::optional<absl::Status> started_;
  std::unique_ptr<drav1::DRAPlugin::AsyncService> v1_;
  std::unique_ptr<drav1beta1::DRAPlugin::AsyncService> v1beta1_;
  std::unique_ptr<drahealth::DRAResourceHealth::AsyncService> health_;
  std::unique_ptr<pluginregistration::Registration::AsyncService> registration_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionLoop> loop_;
  absl::Mutex acceptors_mu_;
  std::vector<std::unique_ptr<Acceptor>> acceptors_ ABSL_GUARDED_BY(acceptors_mu_);
  mutable absl::Mutex owners_mu_;
  absl::flat_hash_map<int, DraPluginServer*> owners_ ABSL_GUARDED_BY(owners_mu_);  // by fd
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRA_GRPC_SERVER_H_
