#include "edgeaccel/dra/dra_plugin_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {

DraPluginServer::DraPluginServer(Options options, DraPluginService* service)
    : options_(std::move(options)), service_(service) {}

DraPluginServer::~DraPluginServer() { Stop(absl::ZeroDuration()); }

std::string DraPluginServer::service_socket() const {
  return absl::StrCat(options_.kubelet_root, "/plugins/", options_.driver, "/dra.sock");
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

absl::Status DraPluginServer::Start() {
  const std::string plugin_dir = absl::StrCat(options_.kubelet_root, "/plugins/", options_.driver);
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

  v1_ = std::make_unique<drav1::DRAPlugin::AsyncService>();
  v1beta1_ = std::make_unique<drav1beta1::DRAPlugin::AsyncService>();
  health_ = std::make_unique<drahealth::DRAResourceHealth::AsyncService>();
  registration_ = std::make_unique<pluginregistration::Registration::AsyncService>();
  grpc::ServerBuilder builder;
  for (const std::string& path : {service_socket(), registration_socket()}) {
    builder.AddListeningPort(absl::StrCat("unix:", path), grpc::InsecureServerCredentials());
  }
  builder.RegisterService(v1_.get());
  builder.RegisterService(v1beta1_.get());
  builder.RegisterService(health_.get());
  builder.RegisterService(registration_.get());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    v1_.reset();
    v1beta1_.reset();
    health_.reset();
    registration_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", service_socket(), " and ", registration_socket()));
  }
  // Only the kubelet (root) may prepare claims or register us.
  chmod(service_socket().c_str(), 0600);
  chmod(registration_socket().c_str(), 0600);
  service_inode_ = SocketInode(service_socket());
  registration_inode_ = SocketInode(registration_socket());
  loop_ = std::make_unique<CompletionLoop>(std::move(cq), "ea-dra");
  service_->Serve(v1_.get(), v1beta1_.get(), health_.get(), loop_.get());
  ServeRegistration(
      registration_.get(), loop_.get(),
      [this](const pluginregistration::InfoRequest&, pluginregistration::PluginInfo* response) {
        return GetInfo(response);
      },
      [this](const pluginregistration::RegistrationStatus& request,
             pluginregistration::RegistrationStatusResponse*) { return Notify(request); });
  loop_->Start();
  LOG(INFO) << options_.driver << ": DRA driver serving " << service_socket() << ", registering at "
            << registration_socket();
  return absl::OkStatus();
}

void DraPluginServer::Stop(absl::Duration grace) {
  if (server_ != nullptr) {
    // The registration socket first: its removal is the deregistration the kubelet sees.
    RemoveSocketIfOurs(registration_socket(), registration_inode_);
    registration_inode_ = 0;
    service_->EndStreams();
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
    loop_->Drain();
    service_->JoinCalls();  // a prepare still reading a claim (ended by the client's Cancel)
    server_->Wait();
    loop_.reset();
    server_.reset();
    RemoveSocketIfOurs(service_socket(), service_inode_);
    service_inode_ = 0;
  }
  v1_.reset();
  v1beta1_.reset();
  health_.reset();
  registration_.reset();
  registered_.store(false);
}

}  // namespace edgeaccel
