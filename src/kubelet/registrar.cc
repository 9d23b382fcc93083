#include "edgeaccel/kubelet/registrar.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/inventory/replicas.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/kubelet_checkpoint.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(100);
// The least time between two looks at a plugin we leave a resource to.
constexpr absl::Duration kOtherPluginLookInterval = absl::Seconds(1);
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

ResourceRegistrar::ResourceRegistrar(Options options, DeviceSet* set)
    : options_(std::move(options)),
      set_(set),
      watcher_service_(set->resource_name(),
                       [this](const std::string& error) {
                         Warn("DevicePluginRegistrationRefused",
                              absl::StrCat(set_->resource_name(), ": the kubelet's plugin "
                                           "watcher refused the registration: ", error));
                       }),
      backoff_(kInitialBackoff, options_.max_backoff, /*jitter=*/0.2) {}

ResourceRegistrar::~ResourceRegistrar() { Stop(); }

std::string ResourceRegistrar::DirectoryFor(RegistrationMode mode) const {
  if (mode == RegistrationMode::kPluginWatcher) {
    return absl::StrCat(options_.kubelet_root, "/", kPluginsRegistryDir);
  }
  return options_.device_plugin_dir;
}

std::string ResourceRegistrar::KubeletSocket() const {
  return absl::StrCat(DirectoryFor(RegistrationMode::kKubelet), "/", kKubeletSocketName);
}

std::optional<ResourceRegistrar::SocketId> ResourceRegistrar::KubeletSocketId() const {
  struct stat st;
  if (stat(KubeletSocket().c_str(), &st) != 0) return std::nullopt;
  return SocketId{st.st_ino, static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 +
                                 st.st_ctim.tv_nsec};
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
  // What registering needs (an inotify instance, three eventfds) can be missing for a while: the
  // node's fs.inotify.max_user_instances used up by other pods, or this process at its fd limit.
  // The thread then keeps trying, with backoff, instead of the resource never registering.
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ea-register");
    if (SetUp()) Run();
  });
  return absl::OkStatus();
}

bool ResourceRegistrar::SetUp() {
  Backoff backoff(absl::Seconds(1), options_.max_backoff, /*jitter=*/0.2);
  std::string last_error;
  int fds[3] = {-1, -1, -1};  // stop, call done, stream event
  while (!stopping_.load()) {
    std::string error;
    if (!inotify_.Open()) {
      error = absl::StrCat("no inotify instance (", strerror(errno),
                           "; is fs.inotify.max_user_instances used up?)");
    }
    for (int& fd : fds) {
      if (error.empty() && fd < 0) {
        fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) error = absl::StrCat("eventfd: ", strerror(errno));
      }
    }
    if (error.empty()) {
      if (!last_error.empty()) LOG(INFO) << set_->resource_name() << ": registration can start now";
      absl::MutexLock lock(&stop_mu_);  // Stop() reads stop_fd_ under it
      stop_fd_ = fds[0];
      call_done_fd_ = fds[1];
      stream_event_fd_ = fds[2];
      return !stop_requested_;
    }
    const absl::Duration wait = backoff.Next();
    if (error != last_error) {
      LOG(ERROR) << set_->resource_name() << ": cannot start registration: " << error
                 << "; trying again (next in " << absl::FormatDuration(wait) << ")";
      last_error = error;
    }
    absl::MutexLock lock(&stop_mu_);
    stop_mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), wait);
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  return false;
}

void ResourceRegistrar::Stop() {
  if (thread_.joinable()) {
    stopping_.store(true);
    int stop_fd;
    {
      absl::MutexLock lock(&stop_mu_);
      stop_requested_ = true;  // wakes SetUp's wait
      stop_fd = stop_fd_;
    }
    uint64_t one = 1;
    if (stop_fd >= 0) (void)!write(stop_fd, &one, sizeof(one));
    thread_.join();
  }
  std::unique_ptr<PluginServer> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (server != nullptr) server->Stop();
  other_watch_.reset();  // before its eventfd closes
  for (int* fd : {&stop_fd_, &call_done_fd_, &stream_event_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void ResourceRegistrar::Readvertise() {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr) server_->Readvertise();
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

std::string ResourceRegistrar::left_to() const {
  absl::MutexLock lock(&mu_);
  return left_to_;
}

std::string ResourceRegistrar::socket_path() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? std::string() : server_->socket_path();
}

void ResourceRegistrar::Complain(const std::string& message) {
  if (message == last_complaint_) return;
  last_complaint_ = message;
  LOG(WARNING) << set_->resource_name() << ": " << message;
}

void ResourceRegistrar::StartRegisterCall(const SocketId& kubelet) {
  const std::string resource = set_->resource_name();
  if (registered_kubelet_id_.inode != 0 && kubelet != registered_kubelet_id_ &&
      kubelet != restart_counted_for_) {
    restart_counted_for_ = kubelet;
    kubelet_restarts_.fetch_add(1);
    LOG(INFO) << resource << ": " << KubeletSocket()
              << " was re-created: the kubelet restarted; registering again";
  }
  auto call = std::make_unique<RegisterCall>();
  call->channel = DialUnixSocket(KubeletSocket());
  call->stub = v1beta1::Registration::NewStub(call->channel);
  call->request.set_version(std::string(kDevicePluginApiVersion));
  call->request.set_endpoint(SocketFileName(resource));
  call->request.set_resource_name(resource);
  *call->request.mutable_options() = AdvertisedOptions(options_.plugin);
  call->kubelet = kubelet;
  call->started = absl::Now();
  call->context.set_deadline(std::chrono::system_clock::now() +
                             absl::ToChronoMilliseconds(options_.register_timeout));
  // Wait for the kubelet to accept connections (it may be a moment behind its socket file).
  call->context.set_wait_for_ready(true);
  RegisterCall* raw = call.get();
  {
    absl::MutexLock lock(&mu_);
    call_ = std::move(call);
  }
  const int done_fd = call_done_fd_;
  raw->stub->async()->Register(&raw->context, &raw->request, &raw->response,
                               [raw, done_fd](grpc::Status status) {
                                 raw->status = std::move(status);
                                 uint64_t one = 1;
                                 (void)!write(done_fd, &one, sizeof(one));
                               });
}

void ResourceRegistrar::CancelRegisterCall() {
  absl::MutexLock lock(&mu_);
  if (call_ == nullptr) return;
  call_->cancelled_by_us = true;
  call_->context.TryCancel();
}

void ResourceRegistrar::FinishRegisterCall() {
  std::unique_ptr<RegisterCall> call;
  bool cancelled_by_us = false;
  {
    absl::MutexLock lock(&mu_);
    call = std::move(call_);
    if (call != nullptr) cancelled_by_us = call->cancelled_by_us;
  }
  if (call == nullptr) return;
  const std::string resource = set_->resource_name();
  const grpc::Status& status = call->status;
  if (status.ok()) {
    registered_kubelet_id_ = call->kubelet;
    registered_kubelet_.store(true);
    endpoint_lost_.store(false);
    registrations_.fetch_add(1);
    backoff_.Reset();
    last_complaint_.clear();
    // A kubelet that restarted while we were registering needs us again.
    need_register_ = KubeletSocketId() != std::optional<SocketId>(call->kubelet);
    LOG(INFO) << resource << ": registered with the kubelet ("
              << absl::FormatDuration(absl::Now() - call->started) << ")";
    return;
  }
  if (cancelled_by_us) {
    // Our socket vanished, or a newer kubelet appeared: the loop starts over at once.
    return;
  }
  if (KubeletSocketId() != std::optional<SocketId>(call->kubelet)) {
    // The kubelet we called is gone (restarted under the call): its failure says nothing about
    // the new one, so no backoff. If there is no kubelet.sock yet, the loop waits for it.
    need_register_ = true;
    retry_at_ = absl::InfinitePast();
    VLOG(1) << resource << ": Register failed on a kubelet that has since restarted; retrying";
    return;
  }
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    message = absl::StrCat("no answer from ", KubeletSocket(), " within ",
                           absl::FormatDuration(options_.register_timeout),
                           " (is the kubelet running? is --device-plugin-dir right?)");
  }
  retry_at_ = absl::Now() + backoff_.Next();
  const std::string complaint =
      absl::StrCat("the kubelet did not accept our registration: ", message);
  if (complaint + "; retrying with backoff" != last_complaint_) {
    Warn("DevicePluginRegistrationRefused", absl::StrCat(resource, ": ", complaint));
  }
  Complain(absl::StrCat(complaint, "; retrying with backoff"));
}

void ResourceRegistrar::Warn(const std::string& reason, const std::string& message) {
  if (options_.warn) options_.warn(reason, message);
}

void ResourceRegistrar::Wait(absl::Duration timeout) {
  struct pollfd fds[4] = {{inotify_.fd(), POLLIN, 0},
                          {stop_fd_, POLLIN, 0},
                          {call_done_fd_, POLLIN, 0},
                          {stream_event_fd_, POLLIN, 0}};
  int timeout_ms = -1;
  if (timeout != kUntilEvent) {
    // A deadline computed from an earlier clock reading may already have passed: poll, do not
    // sleep forever.
    timeout_ms = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1)))));
  }
  if (!inotify_.complete()) {
    // Some directory cannot be watched: look again every second rather than miss a kubelet.
    timeout_ms = timeout_ms < 0 ? 1000 : std::min(timeout_ms, 1000);
  }
  if (poll(fds, 4, timeout_ms) <= 0) return;
  if (fds[2].revents & POLLIN) {
    uint64_t count;
    (void)!read(call_done_fd_, &count, sizeof(count));
    FinishRegisterCall();
  }
  if (fds[3].revents & POLLIN) {
    uint64_t count;
    (void)!read(stream_event_fd_, &count, sizeof(count));
    // One of our streams ended (look once the kubelet has made its next move), or the one we
    // hold to the plugin we left the resource to did.
    check_endpoint_at_ = std::min(check_endpoint_at_, absl::Now() + options_.lost_endpoint_settle);
    recheck_other_ = true;
  }
  bool rearm = false;
  std::vector<DirectoryWatcher::Event> events = inotify_.Drain(&rearm);
  // Sockets came or went: whoever we left the resource to may be gone, or back.
  for (const DirectoryWatcher::Event& event : events) {
    if (event.name != SocketFileName(set_->resource_name())) recheck_other_ = true;
  }
  if (rearm || !inotify_.complete()) {
    // Events may have been lost (overflow, a directory re-created): compare with what we know.
    std::optional<SocketId> now = KubeletSocketId();
    if (now.has_value() && *now != registered_kubelet_id_) need_register_ = true;
  }
  for (const DirectoryWatcher::Event& event : events) {
    if (event.directory != 0 || event.name != kKubeletSocketName) continue;
    if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
      std::optional<SocketId> now = KubeletSocketId();
      if (!now.has_value() || *now == registered_kubelet_id_) continue;
      need_register_ = true;
      retry_at_ = absl::InfinitePast();  // a new kubelet: try at once, whatever the backoff
      backoff_.Reset();
      absl::MutexLock lock(&mu_);
      if (call_ != nullptr && call_->kubelet != *now) {
        call_->cancelled_by_us = true;
        call_->context.TryCancel();
      }
    } else if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
      registered_kubelet_.store(false);
    }
  }
  // Re-arming happens at the top of the loop in Run().
}

void ResourceRegistrar::StopServing() {
  CancelRegisterCall();
  std::unique_ptr<PluginServer> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (server != nullptr) server->Stop();
  registered_kubelet_.store(false);
  watcher_service_.EndpointLost();
}

OtherPluginQuery ResourceRegistrar::OtherPluginQueryNow() const {
  OtherPluginQuery query;
  query.resource = set_->resource_name();
  query.device_plugin_dir = DirectoryFor(RegistrationMode::kKubelet);
  query.plugins_registry_dir = DirectoryFor(RegistrationMode::kPluginWatcher);
  query.own_socket_name = SocketFileName(query.resource);
  // Held for the loop: a range-for over Current()->devices would outlive the temporary.
  const std::shared_ptr<const Snapshot> snapshot = set_->Current();
  for (const Device& device : snapshot->devices) query.own_ids.push_back(device.id);
  absl::StatusOr<KubeletCheckpoint> checkpoint = ReadKubeletCheckpoint(
      absl::StrCat(query.device_plugin_dir, "/", kKubeletCheckpointName));
  if (checkpoint.ok()) {
    auto held = checkpoint->registered_devices.find(query.resource);
    if (held != checkpoint->registered_devices.end()) query.kubelet_ids = held->second;
  } else {
    VLOG(1) << query.resource << ": " << checkpoint.status().message();
  }
  query.timeout = options_.other_plugin_timeout;
  return query;
}

std::optional<OtherPlugin> ResourceRegistrar::FindOtherServer() const {
  return FindOtherPlugin(OtherPluginQueryNow());
}

bool ResourceRegistrar::LeaveToOtherPlugin() {
  last_other_look_ = absl::Now();
  const std::string resource = set_->resource_name();
  const OtherPluginQuery query = OtherPluginQueryNow();
  std::optional<OtherPlugin> other = FindOtherPlugin(query);
  const std::string was_left_to = left_to();
  auto leave = [&](const std::string& to) {
    {
      absl::MutexLock lock(&mu_);
      left_to_ = to;
    }
    StopServing();
    registrations_when_left_ = registrations();
  };
  if (other.has_value() && options_.take_over) {
    Complain(absl::StrCat(other->socket, " serves ", resource, " too (", other->evidence,
                          "); registering it anyway, as --take-over asks"));
    return false;
  }
  if (other.has_value()) {
    // A fresh stream each time: the last one may be what just ended (the plugin restarted).
    other_watch_ = std::make_unique<OtherPluginWatch>(other->socket, stream_event_fd_);
    other_grace_until_ = absl::InfinitePast();
    leave(other->socket);
    // Said once the state holds: /healthz and left_to() agree with the log from this line on.
    if (was_left_to != other->socket) {
      Warn("DevicePluginTakeoverRefused",
           absl::StrCat(resource, ": not registered: another device plugin serves it (",
                        other->socket, ": ", other->evidence,
                        "); start with --take-over to replace it"));
      LOG(WARNING) << resource << ": not registering it: another device plugin serves it ("
                   << other->socket << ", registered through " << other->registration << ": "
                   << other->evidence << "). Leaving " << resource
                   << " to that plugin; to serve it from edgeaccel instead, remove that plugin "
                      "or pass --take-over="
                   << resource;
    }
    return true;
  }
  other_watch_.reset();
  // No plugin serves it now. If the kubelet still holds devices of the resource that are not
  // ours, the plugin that served them may be on its way back (after a kubelet restart every
  // plugin registers again): give it a moment rather than take the resource from it. Not when
  // the last registration of the resource was ours: then what the kubelet holds is what we
  // advertised, devices unplugged since included.
  const bool last_registered_by_us = registrations() > registrations_when_left_;
  std::string theirs;
  if (!options_.take_over && !last_registered_by_us && !query.kubelet_ids.empty()) {
    absl::flat_hash_set<std::string> ours;
    for (const std::string& own : query.own_ids) ours.insert(PhysicalIdOf(own));
    bool any_ours = false;
    for (const std::string& id : query.kubelet_ids) any_ours |= ours.contains(PhysicalIdOf(id));
    if (!any_ours) theirs = query.kubelet_ids.front();
  }
  if (!theirs.empty()) {
    const bool first_look = other_grace_until_ == absl::InfinitePast();
    if (first_look) other_grace_until_ = absl::Now() + options_.other_plugin_grace;
    if (absl::Now() < other_grace_until_) {
      recheck_other_at_ = other_grace_until_;
      leave("(waiting for the plugin that served it)");
      if (first_look) {
        LOG(INFO) << resource << ": the kubelet holds devices of " << resource
                  << " that are not ours (" << theirs
                  << ", ...) but no plugin serves them now; waiting up to "
                  << absl::FormatDuration(options_.other_plugin_grace)
                  << " for the plugin that did to register again before registering ours";
      }
      return true;
    }
  }
  if (!was_left_to.empty()) {
    LOG(INFO) << resource << ": no other plugin serves it now; serving and registering it";
    absl::MutexLock lock(&mu_);
    left_to_.clear();
  }
  return false;
}

void ResourceRegistrar::CheckEndpoint(RegistrationMode mode) {
  const std::string resource = set_->resource_name();
  {
    absl::MutexLock lock(&mu_);
    if (server_ == nullptr || server_->OpenStreams() > 0 || call_ != nullptr) return;
  }
  std::string where;
  if (mode == RegistrationMode::kKubelet) {
    if (!registered_kubelet_.load()) return;
    // A new kubelet.sock is a restart, handled as one.
    if (KubeletSocketId() != std::optional<SocketId>(registered_kubelet_id_)) return;
    if (!UnixSocketAnswers(KubeletSocket())) {
      LOG(INFO) << resource << ": the kubelet ended our ListAndWatch stream and " << KubeletSocket()
                << " does not answer: the kubelet has stopped; registering again when it is back";
      registered_kubelet_.store(false);
      return;
    }
    where = absl::StrCat(KubeletSocket(), " is unchanged");
  } else {
    if (!watcher_service_.registered()) return;
    where = "our socket is still in place";
  }
  endpoint_lost_.store(true);
  registered_kubelet_.store(false);
  watcher_service_.EndpointLost();
  LOG(WARNING) << resource << ": the kubelet ended our ListAndWatch stream while " << where
               << ": it dropped our endpoint (another plugin registered " << resource
               << ", or the late deregistration of a plugin that served it before). Until we are "
                  "registered again the kubelet counts these devices Unhealthy.";
  if (LeaveToOtherPlugin()) return;
  retry_at_ = absl::Now() + backoff_.Next();
  LOG(WARNING) << resource << ": no other plugin serves it; registering again in "
               << absl::FormatDuration(retry_at_ - absl::Now());
  if (mode == RegistrationMode::kKubelet) {
    need_register_ = true;
  } else {
    StopServing();  // a new socket: the plugin watcher registers it again
  }
}

void ResourceRegistrar::Run() {
  const std::string resource = set_->resource_name();
  while (!stopping_.load()) {
    inotify_.Arm({DirectoryFor(RegistrationMode::kKubelet),
                  DirectoryFor(RegistrationMode::kPluginWatcher)});
    const RegistrationMode mode = EffectiveMode();
    if (mode == RegistrationMode::kAuto) {
      Complain(absl::StrCat("waiting for the kubelet: neither ",
                            DirectoryFor(RegistrationMode::kKubelet), " nor ",
                            DirectoryFor(RegistrationMode::kPluginWatcher),
                            " exists yet (is the kubelet running on this node? is "
                            "--kubelet-root its --root-dir? microk8s uses "
                            "/var/snap/microk8s/common/var/lib/kubelet)"));
      Wait(kUntilEvent);
      continue;
    }
    if (absl::Now() >= check_endpoint_at_) {
      check_endpoint_at_ = absl::InfiniteFuture();
      CheckEndpoint(mode);
    }

    // 0. Left to another plugin: look again only when something changed, and at most once a
    //    second: a plugin that ends every stream at once (or a directory that never settles)
    //    must not turn the look into a busy loop.
    if (!left_to().empty()) {
      if (recheck_other_) {
        recheck_other_at_ = std::min(
            recheck_other_at_, std::max(absl::Now(), last_other_look_ + kOtherPluginLookInterval));
      }
      recheck_other_ = false;
      if (absl::Now() >= recheck_other_at_) {
        recheck_other_at_ = absl::InfiniteFuture();
        LeaveToOtherPlugin();
      }
      if (!left_to().empty()) {
        Wait(recheck_other_at_ == absl::InfiniteFuture() ? kUntilEvent
                                                         : recheck_other_at_ - absl::Now());
        continue;
      }
    }
    recheck_other_ = false;

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
      CancelRegisterCall();  // a Register naming the vanished socket cannot succeed
      stale->Stop();
      registered_kubelet_.store(false);
    }
    if (!serving) {
      if (absl::Now() < retry_at_) {
        Wait(retry_at_ - absl::Now());
        continue;
      }
      // Never take a resource another plugin serves (unless told to).
      if (LeaveToOtherPlugin()) continue;
      const std::string path = absl::StrCat(DirectoryFor(mode), "/", SocketFileName(resource));
      const int stream_event_fd = stream_event_fd_;
      auto server = std::make_unique<PluginServer>(
          path, set_, &counters_,
          mode == RegistrationMode::kPluginWatcher ? &watcher_service_ : nullptr,
          options_.plugin, [stream_event_fd] {
            uint64_t one = 1;
            (void)!write(stream_event_fd, &one, sizeof(one));
          });
      absl::Status status = server->Start();
      if (!status.ok()) {
        retry_at_ = absl::Now() + backoff_.Next();
        Complain(absl::StrCat(status.message(), "; will try again (waiting up to ",
                              absl::FormatDuration(options_.max_backoff), " between tries)"));
        Wait(retry_at_ - absl::Now());
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        server_ = std::move(server);
        active_mode_ = mode;
      }
      last_complaint_.clear();
      if (!endpoint_lost_.load()) backoff_.Reset();  // a lost endpoint keeps backing off
      retry_at_ = absl::InfinitePast();
      need_register_ = mode == RegistrationMode::kKubelet;
      LOG(INFO) << resource << ": serving on " << path << " ("
                << (mode == RegistrationMode::kKubelet
                        ? "registering with kubelet.sock"
                        : "waiting for the kubelet's plugin watcher to find it")
                << ")";
    }

    // 2. Kubelet mode: call Register whenever the kubelet is new or our socket is.
    bool call_in_flight;
    {
      absl::MutexLock lock(&mu_);
      call_in_flight = call_ != nullptr;
    }
    absl::Duration wait = kUntilEvent;
    if (mode == RegistrationMode::kKubelet && need_register_ && !call_in_flight) {
      std::optional<SocketId> kubelet = KubeletSocketId();
      if (!kubelet.has_value()) {
        Complain(absl::StrCat("waiting for the kubelet: ", KubeletSocket(),
                              " is not there yet; will register as soon as it appears"));
      } else if (absl::Now() < retry_at_) {
        wait = retry_at_ - absl::Now();
      } else if (!LeaveToOtherPlugin()) {
        StartRegisterCall(*kubelet);
      } else {
        continue;
      }
    }
    if (check_endpoint_at_ != absl::InfiniteFuture()) {
      const absl::Duration until_check = check_endpoint_at_ - absl::Now();
      wait = wait == kUntilEvent ? until_check : std::min(wait, until_check);
    }
    Wait(wait);
  }
  // Stopping: a call in flight is cancelled, and its callback must have run before the call's
  // state is freed.
  CancelRegisterCall();
  bool in_flight;
  {
    absl::MutexLock lock(&mu_);
    in_flight = call_ != nullptr;
  }
  if (in_flight) {
    struct pollfd done = {call_done_fd_, POLLIN, 0};
    poll(&done, 1, -1);
    std::unique_ptr<RegisterCall> call;
    absl::MutexLock lock(&mu_);
    call = std::move(call_);
  }
}

}  // namespace edgeaccel
