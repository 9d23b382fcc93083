#include "edgeaccel/kubelet/plugin_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {

PluginServer::PluginServer(std::string socket_path, DeviceSet* set, PluginCounters* counters,
                           PluginWatcherService* registration, PluginOptions options,
                           std::function<void()> on_stream_cancelled)
    : socket_path_(std::move(socket_path)),
      set_(set),
      counters_(counters),
      registration_(registration),
      options_(std::move(options)),
      on_stream_cancelled_(std::move(on_stream_cancelled)) {}

int PluginServer::OpenStreams() const {
  return service_ == nullptr ? 0 : service_->OpenStreams();
}

void PluginServer::Readvertise() {
  if (service_ != nullptr) service_->Readvertise();
}

PluginServer::~PluginServer() { Stop(); }

absl::Status PluginServer::Start() {
  if (server_ != nullptr) return absl::OkStatus();
  absl::Status free = FreeSocketPath(
      socket_path_, "remove it, or point --device-plugin-dir (or --kubelet-root) elsewhere");
  if (!free.ok()) return free;

  service_ = std::make_unique<DevicePluginService>(set_, counters_, options_, on_stream_cancelled_);
  device_plugin_grpc_ = std::make_unique<v1beta1::DevicePlugin::AsyncService>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path_), grpc::InsecureServerCredentials());
  builder.RegisterService(device_plugin_grpc_.get());
  if (registration_ != nullptr) {
    registration_grpc_ = std::make_unique<pluginregistration::Registration::AsyncService>();
    builder.RegisterService(registration_grpc_.get());
  }
  if (also_serve_ != nullptr) builder.RegisterService(also_serve_);
  // Keep a kubelet's idle ListAndWatch connection alive without pings from our side.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    device_plugin_grpc_.reset();
    registration_grpc_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_,
                                               " (does the directory exist and is it writable?)"));
  }
  loop_ = std::make_unique<CompletionLoop>(std::move(cq), "ea-grpc");
  service_->Serve(device_plugin_grpc_.get(), loop_.get());
  if (registration_ != nullptr) registration_->Serve(registration_grpc_.get(), loop_.get());
  loop_->Start();
  // Only root (the kubelet) may connect: device plugin sockets hand out device access.
  chmod(socket_path_.c_str(), 0600);
  inode_ = SocketInode(socket_path_);
  VLOG(1) << "serving " << set_->resource_name() << " on " << socket_path_;
  return absl::OkStatus();
}

void PluginServer::Stop(absl::Duration grace) {
  if (server_ == nullptr) return;
  service_->EndStreams();
  // Calls still open at the deadline are cancelled; the loop runs their last events (and frees
  // every call object still waiting) before the server and the services go.
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  loop_->Drain();
  server_->Wait();
  loop_.reset();
  server_.reset();
  service_.reset();
  device_plugin_grpc_.reset();
  registration_grpc_.reset();
  RemoveSocketIfOurs(socket_path_, inode_);
  inode_ = 0;
}

WatcherProbe::WatcherProbe(std::string socket_path, std::function<void()> on_asked)
    : socket_path_(std::move(socket_path)), on_asked_(std::move(on_asked)) {}

WatcherProbe::~WatcherProbe() { Stop(); }

absl::Status WatcherProbe::Start() {
  if (server_ != nullptr) return absl::OkStatus();
  absl::Status free = FreeSocketPath(socket_path_, "remove it, or point --kubelet-root elsewhere");
  if (!free.ok()) return free;
  service_ = std::make_unique<pluginregistration::Registration::AsyncService>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path_), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_));
  }
  loop_ = std::make_unique<CompletionLoop>(std::move(cq), "ea-probe");
  ServeRegistration(
      service_.get(), loop_.get(),
      [this](const grpc::ServerContext&, const pluginregistration::InfoRequest&,
             pluginregistration::PluginInfo*) {
        if (on_asked_) on_asked_();
        // What the kubelet logs ("failed to get plugin info using RPC GetInfo").
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "not a plugin: edgeaccel registers through kubelet.sock and only "
                            "waited here for the plugin watcher to let go of this path");
      });
  loop_->Start();
  chmod(socket_path_.c_str(), 0600);
  inode_ = SocketInode(socket_path_);
  return absl::OkStatus();
}

void WatcherProbe::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  loop_->Drain();
  server_->Wait();
  loop_.reset();
  server_.reset();
  service_.reset();
  RemoveSocketIfOurs(socket_path_, inode_);
  inode_ = 0;
}

bool PluginServer::SocketPresent() const {
  if (server_ == nullptr) return false;
  struct stat st;
  return stat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode_;
}

}  // namespace edgeaccel
