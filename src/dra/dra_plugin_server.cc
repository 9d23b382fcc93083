#include "edgeaccel/dra/dra_plugin_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {

DraPluginServer::DraPluginServer(Options options, DraPluginService* service)
    : options_(std::move(options)), service_(service) {}

DraPluginServer::~DraPluginServer() { Stop(absl::ZeroDuration()); }

std::string DraPluginServer::service_socket() const {
  return absl::StrCat(DraPluginDir(options_.kubelet_root, options_.driver), "/", kDraServiceSocketName);
}

std::string DraPluginServer::registration_socket() const {
  return absl::StrCat(options_.kubelet_root, "/plugins_registry/", options_.driver, "-reg.sock");
}

grpc::Status DraPluginServer::GetInfo(pluginregistration::PluginInfo* info) const {
  info->set_type("DRAPlugin");
  info->set_name(options_.driver);
  info->set_endpoint(service_socket());
  for (const char* version : kDraSupportedVersions) info->add_supported_versions(version);
  return grpc::Status::OK;
}

grpc::Status DraPluginServer::Notify(const pluginregistration::RegistrationStatus& status) {
  if (status.plugin_registered()) {
    registrations_.fetch_add(1);
    registered_.store(true);
    LOG(INFO) << options_.driver << ": registered with the kubelet as a DRA driver (" << service_socket() << ")";
    if (options_.on_registered) options_.on_registered();
  } else {
    registered_.store(false);
    LOG(ERROR) << options_.driver << ": the kubelet refused the DRA driver's registration: " << status.error();
    if (options_.on_refused) options_.on_refused(status.error());
  }
  return grpc::Status::OK;
}

namespace {

// A non-blocking socket listening at `path`, which only its owner (root: the kubelet) may
// connect to: the mode is set before listen(), so no one else connects in between.
absl::StatusOr<int> ListenAt(const std::string& path) {
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too long for a Unix socket (at most ",
                                                   sizeof(address.sun_path) - 1, " bytes)"));
  }
  memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  if (bind(fd, reinterpret_cast<const struct sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", strerror(error)));
  }
  if (chmod(path.c_str(), 0600) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    unlink(path.c_str());  // what bind made
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", strerror(error)));
  }
  return fd;
}

}  // namespace

absl::Status DraPluginServer::Start() {
  const std::string plugin_dir = DraPluginDir(options_.kubelet_root, options_.driver);
  const std::string registry_dir = absl::StrCat(options_.kubelet_root, "/plugins_registry");
  for (const std::string& dir : {absl::StrCat(options_.kubelet_root, "/plugins"), plugin_dir, registry_dir}) {
    if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat("cannot make ", dir, ": ", strerror(errno),
                                                 " (is the kubelet root ", options_.kubelet_root, " mounted?)"));
    }
  }
  for (const std::string& path : {service_socket(), registration_socket()}) {
    absl::Status free = FreeSocketPath(path, "remove it, or point --kubelet-root elsewhere");
    if (!free.ok()) return free;
  }
  DraGrpcServer* grpc = options_.grpc;
  if (grpc == nullptr) {
    own_grpc_ = std::make_unique<DraGrpcServer>();
    grpc = own_grpc_.get();
  }
  if (absl::Status started = grpc->Start(); !started.ok()) {
    own_grpc_.reset();
    return started;
  }
  // The service socket first: the kubelet's plugin watcher dials the endpoint it is told of as
  // soon as the registration socket appears.
  absl::StatusOr<int> service_fd = ListenAt(service_socket());
  if (!service_fd.ok()) {
    own_grpc_.reset();
    return service_fd.status();
  }
  absl::StatusOr<int> registration_fd = ListenAt(registration_socket());
  if (!registration_fd.ok()) {
    close(*service_fd);
    unlink(service_socket().c_str());
    own_grpc_.reset();
    return registration_fd.status();
  }
  service_fd_ = *service_fd;
  registration_fd_ = *registration_fd;
  service_inode_ = SocketInode(service_socket());
  registration_inode_ = SocketInode(registration_socket());
  grpc_ = grpc;
  // Every call goes to the driver whose socket its connection came in on.
  service_->Serve(grpc->v1(), grpc->v1beta1(), grpc->health(), grpc->loop(),
                  [grpc](const grpc::ServerContext& context) -> DraPluginService* {
                    DraPluginServer* owner = grpc->OwnerOf(context);
                    return owner != nullptr ? owner->service_ : nullptr;
                  });
  ServeRegistration(
      grpc->registration(), grpc->loop(),
      [grpc](const grpc::ServerContext& context, const pluginregistration::InfoRequest&,
             pluginregistration::PluginInfo* response) {
        DraPluginServer* owner = grpc->OwnerOf(context);
        return owner != nullptr ? owner->GetInfo(response) : DraGrpcServer::NoOwner(context);
      },
      [grpc](const grpc::ServerContext& context, const pluginregistration::RegistrationStatus& request,
             pluginregistration::RegistrationStatusResponse*) {
        DraPluginServer* owner = grpc->OwnerOf(context);
        return owner != nullptr ? owner->Notify(request) : DraGrpcServer::NoOwner(context);
      });
  grpc->Accept(this, {service_fd_, registration_fd_});
  LOG(INFO) << options_.driver << ": DRA driver serving " << service_socket() << ", registering at "
            << registration_socket();
  return absl::OkStatus();
}

void DraPluginServer::Stop(absl::Duration grace) {
  if (grpc_ != nullptr) {
    // The registration socket first: its removal is the deregistration the kubelet sees.
    RemoveSocketIfOurs(registration_socket(), registration_inode_);
    registration_inode_ = 0;
    grpc_->StopAccepting(this);
    close(registration_fd_);
    close(service_fd_);
    registration_fd_ = service_fd_ = -1;
    service_->EndStreams();
    if (own_grpc_ != nullptr) {
      // A prepare still reading a claim (ended by the client's Cancel) is joined once the loop
      // has drained.
      own_grpc_->Stop(grace, [this] { service_->JoinCalls(); });
      own_grpc_.reset();
    }
    grpc_ = nullptr;
    RemoveSocketIfOurs(service_socket(), service_inode_);
    service_inode_ = 0;
  }
  registered_.store(false);
}

}  // namespace edgeaccel
