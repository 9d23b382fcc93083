#include "edgeaccel/registration.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "edgeaccel/constants.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(100);
// Wait() with this timeout sleeps until an inotify event or Stop().
constexpr absl::Duration kUntilEvent = -absl::InfiniteDuration();

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::string_view RegistrationModeName(RegistrationMode mode) {
  switch (mode) {
    case RegistrationMode::kAuto:
      return "auto";
    case RegistrationMode::kPluginWatcher:
      return "plugin-watcher";
    case RegistrationMode::kKubelet:
      return "kubelet";
  }
  return "auto";
}

bool ParseRegistrationMode(absl::string_view text, RegistrationMode* mode) {
  for (RegistrationMode m :
       {RegistrationMode::kAuto, RegistrationMode::kPluginWatcher, RegistrationMode::kKubelet}) {
    if (text == RegistrationModeName(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
}

absl::Status RegisterWithKubelet(const std::string& kubelet_socket,
                                 const v1beta1::RegisterRequest& request, absl::Duration timeout,
                                 grpc::ClientContext* context) {
  grpc::ChannelArguments args;
  // A private subchannel with a short reconnect backoff: gRPC's default (1 s, shared between
  // channels) would make us wait a second whenever kubelet.sock exists before it accepts.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 2);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 50);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("unix:", kubelet_socket), grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1beta1::Registration::Stub> stub = v1beta1::Registration::NewStub(channel);
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  context->set_wait_for_ready(true);
  v1beta1::Empty response;
  grpc::Status status = stub->Register(context, request, &response);
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    message = absl::StrCat("no answer from ", kubelet_socket, " within ",
                           absl::FormatDuration(timeout),
                           " (is the kubelet running? is --kubelet-root right?)");
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
}

// ---------------------------------------------------------------------------------------------

PluginWatcherService::PluginWatcherService(std::string resource_name)
    : resource_name_(std::move(resource_name)) {}

grpc::ServerUnaryReactor* PluginWatcherService::GetInfo(grpc::CallbackServerContext* context,
                                                        const pluginregistration::InfoRequest*,
                                                        pluginregistration::PluginInfo* response) {
  response->set_type(std::string(kPluginTypeDevicePlugin));
  response->set_name(resource_name_);
  // Empty endpoint: the DevicePlugin service is on this same socket, at whatever path the
  // kubelet found it (its own view of the host, which may differ from ours in a container).
  response->set_endpoint("");
  response->add_supported_versions(std::string(kDevicePluginApiVersion));
  VLOG(1) << resource_name_ << ": plugin watcher asked for our info";
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PluginWatcherService::NotifyRegistrationStatus(
    grpc::CallbackServerContext* context, const pluginregistration::RegistrationStatus* request,
    pluginregistration::RegistrationStatusResponse*) {
  if (request->plugin_registered()) {
    registered_.store(true);
    registrations_.fetch_add(1);
    LOG(INFO) << resource_name_ << ": registered with the kubelet through its plugin watcher";
  } else {
    registered_.store(false);
    LOG(ERROR) << resource_name_ << ": the kubelet's plugin watcher refused the registration: "
               << request->error() << " (the kubelet retries on its own, with backoff)";
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// ---------------------------------------------------------------------------------------------

ResourceRegistrar::ResourceRegistrar(Options options, DeviceSet* set)
    : options_(std::move(options)), set_(set), watcher_service_(set->resource_name()) {}

ResourceRegistrar::~ResourceRegistrar() { Stop(); }

std::string ResourceRegistrar::DirectoryFor(RegistrationMode mode) const {
  return absl::StrCat(options_.kubelet_root, "/",
                      mode == RegistrationMode::kPluginWatcher ? kPluginsRegistryDir
                                                               : kDevicePluginsDir);
}

RegistrationMode ResourceRegistrar::EffectiveMode() const {
  if (options_.mode != RegistrationMode::kAuto) return options_.mode;
  if (IsDirectory(DirectoryFor(RegistrationMode::kKubelet))) return RegistrationMode::kKubelet;
  if (IsDirectory(DirectoryFor(RegistrationMode::kPluginWatcher))) {
    return RegistrationMode::kPluginWatcher;
  }
  return RegistrationMode::kAuto;  // undecided: no kubelet yet
}

absl::Status ResourceRegistrar::Start() {
  if (!inotify_.ok()) return absl::InternalError("cannot create an inotify instance");
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void ResourceRegistrar::Stop() {
  if (thread_.joinable()) {
    stopping_.store(true);
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    {
      absl::MutexLock lock(&mu_);
      if (register_call_ != nullptr) register_call_->TryCancel();
    }
    thread_.join();
  }
  std::unique_ptr<PluginServer> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (server != nullptr) server->Stop();
  if (stop_fd_ >= 0) close(stop_fd_);
  stop_fd_ = -1;
}

bool ResourceRegistrar::registered() const {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr || !server_->SocketPresent()) return false;
  return active_mode_ == RegistrationMode::kPluginWatcher ? watcher_service_.registered()
                                                          : registered_kubelet_.load();
}

uint64_t ResourceRegistrar::registrations() const {
  return registrations_.load() + watcher_service_.registrations();
}

std::string ResourceRegistrar::socket_path() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? std::string() : server_->socket_path();
}

int ResourceRegistrar::OpenStreams() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? 0 : server_->service()->OpenStreams();
}

void ResourceRegistrar::Complain(const std::string& message) {
  if (message == last_complaint_) return;
  last_complaint_ = message;
  LOG(WARNING) << set_->resource_name() << ": " << message;
}

void ResourceRegistrar::Wait(absl::Duration timeout) {
  struct pollfd fds[2] = {{inotify_.fd(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  int timeout_ms = timeout < absl::ZeroDuration()
                       ? -1
                       : static_cast<int>(absl::ToInt64Milliseconds(timeout));
  if (poll(fds, 2, timeout_ms) <= 0) return;
  bool rearm = false;
  for (const DirectoryWatcher::Event& event : inotify_.Drain(&rearm)) {
    if (event.directory != 0 || event.name != kKubeletSocketName) continue;
    if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
      struct stat st;
      const std::string path = absl::StrCat(DirectoryFor(RegistrationMode::kKubelet), "/",
                                            kKubeletSocketName);
      if (stat(path.c_str(), &st) == 0 && st.st_ino == registered_kubelet_inode_) continue;
      if (registrations_.load() > 0) {
        kubelet_restarts_.fetch_add(1);
        LOG(INFO) << set_->resource_name() << ": " << path
                  << " re-created: the kubelet restarted; registering again";
      }
      need_register_ = true;
    } else if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
      registered_kubelet_.store(false);
    }
  }
  // Re-arming happens at the top of the loop in Run().
}

void ResourceRegistrar::Run() {
  std::mt19937 jitter(std::random_device{}());
  absl::Duration backoff = kInitialBackoff;
  auto next_backoff = [&]() {
    std::uniform_real_distribution<double> spread(0.8, 1.2);
    absl::Duration wait = backoff * spread(jitter);
    backoff = std::min(backoff * 2, options_.max_backoff);
    return wait;
  };
  const std::string resource = set_->resource_name();

  while (!stopping_.load()) {
    inotify_.Arm({DirectoryFor(RegistrationMode::kKubelet),
                  DirectoryFor(RegistrationMode::kPluginWatcher)});
    const RegistrationMode mode = EffectiveMode();
    if (mode == RegistrationMode::kAuto) {
      Complain(absl::StrCat("waiting for the kubelet: neither ",
                            DirectoryFor(RegistrationMode::kKubelet), " nor ",
                            DirectoryFor(RegistrationMode::kPluginWatcher),
                            " exists yet (is --kubelet-root right? k3s uses "
                            "/var/lib/rancher/k3s/agent/kubelet, microk8s "
                            "/var/snap/microk8s/common/var/lib/kubelet)"));
      Wait(kUntilEvent);
      continue;
    }

    // 1. Serve on our socket; serve again whenever it vanishes (the kubelet deletes it when it
    //    restarts) or the mode changes.
    std::unique_ptr<PluginServer> stale;
    bool serving;
    {
      absl::MutexLock lock(&mu_);
      if (server_ != nullptr && (mode != active_mode_ || !server_->SocketPresent())) {
        stale = std::move(server_);
      }
      serving = server_ != nullptr;
    }
    if (stale != nullptr) {
      LOG(INFO) << resource << ": socket " << stale->socket_path()
                << " was removed (kubelet restart?); serving again";
      stale->Stop();
      registered_kubelet_.store(false);
    }
    if (!serving) {
      const std::string path =
          absl::StrCat(DirectoryFor(mode), "/", SocketFileName(resource));
      auto server = std::make_unique<PluginServer>(
          path, set_, &counters_,
          mode == RegistrationMode::kPluginWatcher ? &watcher_service_ : nullptr);
      absl::Status status = server->Start();
      if (!status.ok()) {
        absl::Duration wait = next_backoff();
        Complain(absl::StrCat(status.message(), "; will try again (waiting up to ",
                              absl::FormatDuration(options_.max_backoff), " between tries)"));
        Wait(wait);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        server_ = std::move(server);
        active_mode_ = mode;
      }
      last_complaint_.clear();
      backoff = kInitialBackoff;
      need_register_ = mode == RegistrationMode::kKubelet;
      LOG(INFO) << resource << ": serving on " << path << " ("
                << (mode == RegistrationMode::kKubelet
                        ? "registering with kubelet.sock"
                        : "waiting for the kubelet's plugin watcher to find it")
                << ")";
    }

    // 2. Kubelet mode: call Register whenever the kubelet is new or our socket is.
    if (mode == RegistrationMode::kKubelet && need_register_) {
      const std::string kubelet_socket =
          absl::StrCat(DirectoryFor(mode), "/", kKubeletSocketName);
      struct stat st;
      if (stat(kubelet_socket.c_str(), &st) != 0) {
        Complain(absl::StrCat("waiting for the kubelet: ", kubelet_socket,
                              " is not there yet; will register as soon as it appears"));
        Wait(kUntilEvent);
        continue;
      }
      v1beta1::RegisterRequest request;
      request.set_version(std::string(kDevicePluginApiVersion));
      request.set_endpoint(SocketFileName(resource));
      request.set_resource_name(resource);
      request.mutable_options()->set_get_preferred_allocation_available(true);
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        register_call_ = &context;
      }
      const absl::Time started = absl::Now();
      absl::Status status =
          RegisterWithKubelet(kubelet_socket, request, options_.register_timeout, &context);
      {
        absl::MutexLock lock(&mu_);
        register_call_ = nullptr;
      }
      if (stopping_.load()) break;
      if (status.ok()) {
        need_register_ = false;
        registered_kubelet_inode_ = st.st_ino;
        registered_kubelet_.store(true);
        registrations_.fetch_add(1);
        backoff = kInitialBackoff;
        last_complaint_.clear();
        LOG(INFO) << resource << ": registered with the kubelet ("
                  << absl::FormatDuration(absl::Now() - started) << ")";
      } else {
        absl::Duration wait = next_backoff();
        Complain(absl::StrCat("the kubelet did not accept our registration: ", status.message(),
                              "; retrying with backoff"));
        Wait(wait);
        continue;
      }
    }
    Wait(kUntilEvent);
  }
}

}  // namespace edgeaccel
