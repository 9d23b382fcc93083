// DraPluginServer: the driver's two Unix sockets, as the kubelet's plugin manager expects them
// (docs/dra.md; dra-facts §1):
//  * the service socket <kubelet-root>/plugins/<driver>/dra.sock, where the kubelet calls
//    DRAPlugin v1 or v1beta1 and DRAResourceHealth (DraPluginService);
//  * the registration socket <kubelet-root>/plugins_registry/<driver>-reg.sock, where the
//    kubelet's plugin watcher calls GetInfo (within 1 s) and NotifyRegistrationStatus.
// The sockets are ours; their connections are answered by a DraGrpcServer (dra_grpc_server.h),
// one for every driver of the daemon, whose one loop thread ("ea-dra") answers every call: each
// socket also answers the other's services, which no kubelet calls there. Nothing on the loop
// waits: each NodePrepareResources and NodeUnprepareResources runs on a thread that lives only
// for that call ("ea-dra-call"), so a slow prepare never makes a registration miss its deadline.
// Both sockets are listening (and only the kubelet, root, may connect) before either can be
// dialled; on Stop the registration socket goes first, which is how a plugin deregisters.
#ifndef EDGEACCEL_DRA_DRA_PLUGIN_SERVER_H_
#define EDGEACCEL_DRA_DRA_PLUGIN_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/dra_grpc_server.h"
#include "edgeaccel/dra/dra_plugin_service.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {

// What GetInfo advertises: the DRAPlugin versions (v1 first: a 1.34+ kubelet takes the first it
// knows) and the health service (as the Go helper lists it).
inline constexpr const char* kDraSupportedVersions[] = {"v1.DRAPlugin", "v1beta1.DRAPlugin",
                                                        "v1alpha1.DRAResourceHealth"};

class DraPluginServer {
 public:
  struct Options {
    std::string driver;
    std::string kubelet_root = "/var/lib/kubelet";
    // Called (on the loop thread) when the kubelet says it registered us, and with its
    // error when it refused.
    std::function<void()> on_registered;
    std::function<void(const std::string& error)> on_refused;
    // The server its connections go to, shared with the daemon's other driver (the daemon stops
    // it after every driver); null: one of its own, which Stop() stops.
    DraGrpcServer* grpc = nullptr;
  };

  DraPluginServer(Options options, DraPluginService* service);
  ~DraPluginServer();

  // Makes the plugin directory, replaces stale sockets, listens on both. Errors say which path.
  absl::Status Start();
  // Deregisters, stops accepting and ends the health streams; with a server of its own, also
  // stops it, waiting for the calls being answered (a prepare reading a claim ends at once when
  // the API client is cancelled first; otherwise within the preparer's read timeout). With a
  // shared one, whoever stops that joins the calls (JoinCalls, after its loop drained).
  void Stop(absl::Duration grace = absl::Milliseconds(500));
  void JoinCalls() { service_->JoinCalls(); }

  std::string service_socket() const;
  std::string registration_socket() const;
  uint64_t registrations() const { return registrations_.load(); }
  bool registered() const { return registered_.load(); }

 private:
  // GetInfo and NotifyRegistrationStatus.
  grpc::Status GetInfo(pluginregistration::PluginInfo* info) const;
  grpc::Status Notify(const pluginregistration::RegistrationStatus& status);

  const Options options_;
  DraPluginService* const service_;
  std::unique_ptr<DraGrpcServer> own_grpc_;
  DraGrpcServer* grpc_ = nullptr;  // while started
  int service_fd_ = -1;            // the listening sockets
  int registration_fd_ = -1;
  ino_t registration_inode_ = 0;
  ino_t service_inode_ = 0;
  std::atomic<uint64_t> registrations_{0};
  std::atomic<bool> registered_{false};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRA_PLUGIN_SERVER_H_
