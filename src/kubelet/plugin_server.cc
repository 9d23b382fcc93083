#include "edgeaccel/kubelet/plugin_server.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

// How long a server whose stream the kubelet had open keeps answering after the stream's end
// (see Stop): the kubelet reads the end and drops the endpoint within a millisecond (0.3 ms in
// the lab); more is for a loaded node. Every millisecond of it is one more of the handover's
// window (docs/kubelet-behaviour.md section 11).
constexpr absl::Duration kLastCallsLinger = absl::Milliseconds(5);

// The private sockets of the socket at `path` are ".<name>.<pid>.<n>" beside it: their directory,
// and the start of their names.
struct PrivateSocketNames {
  std::string dir;
  std::string prefix;  // ".<name>."
};
PrivateSocketNames PrivateSocketNamesOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", absl::StrCat(".", path, ".")};
  return {path.substr(0, slash), absl::StrCat(".", path.substr(slash + 1), ".")};
}

// Where gRPC listens for the socket at `path`: a private socket (n: this process's count of
// servers started, so that two of one process, as in a handover, never share one), or `path`
// itself where that name would be too long for a Unix socket.
std::string PrivateSocketPath(const std::string& path) {
  static std::atomic<uint64_t> started{0};
  const PrivateSocketNames names = PrivateSocketNamesOf(path);
  std::string private_path = absl::StrCat(names.dir, "/", names.prefix, getpid(), ".", started++);
  return private_path.size() < sizeof(sockaddr_un::sun_path) ? private_path : path;
}

// Makes `path` a hard link to the socket gRPC listens on at `listen_path`.
absl::Status LinkSocket(const std::string& listen_path, const std::string& path) {
  if (link(listen_path.c_str(), path.c_str()) == 0) return absl::OkStatus();
  const int error = errno;
  return absl::UnavailableError(
      absl::StrCat("cannot link ", path, " to ", listen_path, ": ", strerror(error)));
}

// Removes the private sockets of `path` that nobody answers on: left by a process that died (or
// by this pid in an earlier life).
void RemoveStalePrivateSockets(const std::string& path) {
  const PrivateSocketNames names = PrivateSocketNamesOf(path);
  DIR* listing = opendir(names.dir.c_str());
  if (listing == nullptr) return;
  while (struct dirent* entry = readdir(listing)) {
    if (!absl::StartsWith(entry->d_name, names.prefix)) continue;
    const std::string stale = absl::StrCat(names.dir, "/", entry->d_name);
    struct stat st;
    if (lstat(stale.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && !UnixSocketAnswers(stale)) {
      unlink(stale.c_str());
    }
  }
  closedir(listing);
}

}  // namespace

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

  // gRPC listens on a private name beside the socket's and unlinks that name when it shuts down;
  // the socket the kubelet dials is a hard link to it that only we remove (RemoveSocketIfOurs).
  // Bound to the public path itself, gRPC's unlink at shutdown would remove the socket of the
  // daemon replacing us, should it have bound there the moment ours stopped answering (seen in
  // the lab during a rollout with maxSurge: its registration was dropped). The private name
  // starts with a dot: the kubelet's plugin watcher, and edgeaccel's neighbour look, skip those.
  const std::string listen_path = PrivateSocketPath(socket_path_);
  listen_path_ = listen_path;
  RemoveStalePrivateSockets(socket_path_);

  service_ = std::make_unique<DevicePluginService>(set_, counters_, options_, on_stream_cancelled_);
  device_plugin_grpc_ = std::make_unique<v1beta1::DevicePlugin::AsyncService>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", listen_path), grpc::InsecureServerCredentials());
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
  auto undo = [&](absl::Status status) {
    if (server_ != nullptr) {
      server_->Shutdown();
      server_->Wait();
      cq->Shutdown();
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) {
      }
    }
    server_.reset();
    service_.reset();
    device_plugin_grpc_.reset();
    registration_grpc_.reset();
    return status;
  };
  if (server_ == nullptr) {
    return undo(absl::UnavailableError(absl::StrCat("cannot listen on ", listen_path,
                                                    " (does the directory exist and is it writable?)")));
  }
  // Only root (the kubelet) may connect: device plugin sockets hand out device access. Set
  // before the kubelet can see the socket, through the link.
  chmod(listen_path.c_str(), 0600);
  if (listen_path != socket_path_) {
    if (absl::Status linked = LinkSocket(listen_path, socket_path_); !linked.ok()) {
      return undo(linked);
    }
  }
  loop_ = std::make_unique<CompletionLoop>(std::move(cq), "ea-grpc");
  service_->Serve(device_plugin_grpc_.get(), loop_.get());
  if (registration_ != nullptr) registration_->Serve(registration_grpc_.get(), loop_.get());
  loop_->Start();
  inode_ = SocketInode(socket_path_);
  VLOG(1) << "serving " << set_->resource_name() << " on " << socket_path_;
  return absl::OkStatus();
}

absl::Status PluginServer::LinkAlso(const std::string& path) {
  if (server_ == nullptr || inode_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat("not serving on ", socket_path_));
  }
  if (path == also_path_) return absl::OkStatus();
  if (listen_path_ == socket_path_) {
    return absl::FailedPreconditionError(
        absl::StrCat(socket_path_, " is too long a path for a private socket beside it"));
  }
  absl::Status free = FreeSocketPath(path, "remove it");
  if (!free.ok()) return free;
  if (absl::Status linked = LinkSocket(listen_path_, path); !linked.ok()) return linked;
  also_path_ = path;
  return absl::OkStatus();
}

void PluginServer::RemoveSocket() {
  if (inode_ == 0) return;
  // The second link first: a daemon waiting to take over sees our plugins_registry/ socket, and
  // so knows we registered through the plugin watcher, until the last moment.
  if (!also_path_.empty()) RemoveSocketIfOurs(also_path_, inode_);
  also_path_.clear();
  RemoveSocketIfOurs(socket_path_, inode_);
  inode_ = 0;
}

bool PluginServer::WaitForStreamsAtMost(int most, absl::Time by) {
  return service_ == nullptr || service_->WaitForStreamsAtMost(most, by);
}

void PluginServer::Stop(absl::Duration grace) {
  if (server_ == nullptr) return;
  // The stream's end first, and the server keeps answering a moment longer. The kubelet drops
  // the endpoint when it reads the end (0.3 ms after it in the lab), and calls nothing on it
  // after; a GetPreferredAllocation or Allocate it sent before then is answered: a shutdown
  // cancels a call that has arrived but is not yet matched, and the pod being admitted fails
  // (UnexpectedAdmissionError: 5 pods in one handover on the lab's 1.36 kubelet before this).
  const absl::Time deadline = absl::Now() + grace;
  const bool kubelet_connected = service_->OpenStreams() > 0;
  service_->EndStreams();
  if (kubelet_connected && service_->WaitForStreamsAtMost(0, deadline)) {
    absl::SleepFor(std::min(kLastCallsLinger, std::max(absl::ZeroDuration(), deadline - absl::Now())));
  }
  // The socket goes first: a daemon waiting to take over registers at once.
  RemoveSocket();
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
