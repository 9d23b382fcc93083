#include "edgeaccel/kubelet/registrar.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

RegistrationMachine::Options MachineOptions(const ResourceRegistrar::Options& options,
                                            const std::string& resource) {
  RegistrationMachine::Options machine;
  machine.resource = resource;
  machine.kubelet_socket_path = absl::StrCat(options.device_plugin_dir, "/", kKubeletSocketName);
  machine.device_plugin_dir = options.device_plugin_dir;
  machine.plugins_registry_dir = absl::StrCat(options.kubelet_root, "/", kPluginsRegistryDir);
  machine.max_backoff = options.max_backoff;
  machine.register_timeout = options.register_timeout;
  machine.take_over = options.take_over;
  machine.neighbour_grace = options.neighbour_grace;
  machine.look_budget = options.look_budget;
  machine.watcher_probe_timeout = options.watcher_probe_timeout;
  machine.lost_endpoint_settle = options.lost_endpoint_settle;
  return machine;
}

}  // namespace

ResourceRegistrar::ResourceRegistrar(Options options, DeviceSet* set)
    : options_(std::move(options)),
      set_(set),
      watcher_service_(set->resource_name(),
                       [this](const std::string& error) {
                         Warn("DevicePluginRegistrationRefused",
                              absl::StrCat(set_->resource_name(), ": the kubelet's plugin "
                                           "watcher refused the registration: ", error));
                       }),
      own_loop_(options_.loop == nullptr ? std::make_unique<PollLoop>("ea-register") : nullptr),
      loop_(options_.loop != nullptr ? options_.loop : own_loop_.get()),
      set_up_backoff_(absl::Seconds(1), options_.max_backoff, /*jitter=*/0.2),
      machine_(MachineOptions(options_, set->resource_name()), this, [] { return absl::Now(); }),
      record_(options_.keep_record
                  ? absl::StrCat(options_.device_plugin_dir, "/", kRegistrationRecordDir)
                  : "",
              set->resource_name()) {
  // Written to the probe's eventfd: to the machine, an earlier edgeaccel's word that the watcher
  // let go is what the watcher's question to a probe is.
  watcher_service_.OnWatcherLetGo([this] {
    uint64_t one = 1;
    (void)!write(probe_asked_fd_, &one, sizeof(one));
  });
  std::weak_ptr<OwnIdHistory> weak = own_id_history_;
  auto remember = [weak](const std::shared_ptr<const Snapshot>& snapshot) {
    std::shared_ptr<OwnIdHistory> history = weak.lock();
    if (history == nullptr || snapshot == nullptr) return;
    absl::MutexLock lock(&history->mu);
    for (const Device& device : snapshot->devices) history->ids.insert(device.id);
  };
  own_id_listener_ = set_->Subscribe(remember);
  remember(set_->Current());
}

ResourceRegistrar::~ResourceRegistrar() {
  set_->Unsubscribe(own_id_listener_);
  Stop();
}

std::string ResourceRegistrar::DirectoryFor(RegistrationMode mode) const {
  if (mode == RegistrationMode::kPluginWatcher) {
    return absl::StrCat(options_.kubelet_root, "/", kPluginsRegistryDir);
  }
  return options_.device_plugin_dir;
}

std::string ResourceRegistrar::KubeletSocketPath() const {
  return absl::StrCat(DirectoryFor(RegistrationMode::kKubelet), "/", kKubeletSocketName);
}

absl::Status ResourceRegistrar::Start() {
  // What registering needs (an inotify instance, three eventfds) can be missing for a while: the
  // node's fs.inotify.max_user_instances used up by other pods, or this process at its fd limit.
  // The loop's steps keep trying, with backoff, instead of the resource never registering.
  if (started_) return absl::OkStatus();
  loop_->Add(this);
  started_ = true;
  return absl::OkStatus();
}

bool ResourceRegistrar::SetUp() {
  std::string error;
  if (!inotify_.ok() && !inotify_.Open()) {
    error = absl::StrCat("no inotify instance (", strerror(errno),
                         "; is fs.inotify.max_user_instances used up?)");
  }
  for (int* fd : {&call_done_fd_, &stream_event_fd_, &probe_asked_fd_}) {
    if (error.empty() && *fd < 0) {
      *fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (*fd < 0) error = absl::StrCat("eventfd: ", strerror(errno));
    }
  }
  if (error.empty()) {
    if (!set_up_error_.empty()) {
      LOG(INFO) << set_->resource_name() << ": registration can start now";
    }
    return true;
  }
  start_failures_.fetch_add(1);
  if (error != set_up_error_) {
    LOG(ERROR) << set_->resource_name() << ": cannot start registration: " << error
               << "; trying again with backoff from 1 s";
    set_up_error_ = error;
  }
  return false;
}

void ResourceRegistrar::Stop() {
  StopStepping();
  std::unique_ptr<PluginServer> server;
  std::unique_ptr<WatcherProbe> probe;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
    probe = std::move(probe_);
    leaving_watcher_ = false;
  }
  if (server != nullptr) server->Stop();
  if (probe != nullptr) probe->Stop();
  for (int* fd : {&call_done_fd_, &stream_event_fd_, &probe_asked_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

bool ResourceRegistrar::LeavePluginWatcher() {
  StopStepping();
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr || server_mode_ != RegistrationMode::kPluginWatcher) return false;
  // A server we stepped back from keeps a stream the kubelet replaced: its name is another
  // plugin's now, and waiting would change nothing.
  if (!watcher_service_.registered() || !machine_.left_to().empty()) return false;
  if (server_->OpenStreams() == 0 || !server_->SocketPresent()) return false;
  const std::string also = server_->also_path();
  server_->RemoveSocket();
  leaving_watcher_ = true;
  leaving_streams_ = server_->OpenStreams();
  LOG(INFO) << set_->resource_name() << ": removed " << server_->socket_path()
            << (also.empty() ? "" : absl::StrCat(" and ", also))
            << "; serving until the kubelet's plugin watcher unregisters it (its next pass)";
  return true;
}

void ResourceRegistrar::WaitForTheWatcherToLetGo(absl::Time by) {
  const std::string resource = set_->resource_name();
  PluginServer* server;
  int streams;
  {
    absl::MutexLock lock(&mu_);
    if (!leaving_watcher_ || server_ == nullptr) return;
    leaving_watcher_ = false;
    server = server_.get();  // stays: nothing steps any more, and Stop() comes after this
    streams = leaving_streams_;
  }
  const absl::Time start = absl::Now();
  // The deregistration ends the stream of the client that holds the name: the watcher's, or the
  // kubelet.sock one of a handover registration made after it. Any other stream of ours is a
  // client the kubelet replaced; its end, now that the name has no client, changes nothing, and
  // must come before a successor registers (on 1.25-1.36 it would disconnect the successor).
  if (!server->WaitForStreamsAtMost(streams - 1, by)) {
    LOG(WARNING) << resource << ": the kubelet's plugin watcher did not unregister "
                 << server->socket_path() << " within " << absl::FormatDuration(by - start)
                 << " (is the kubelet running?); stopping anyway";
    return;
  }
  LOG(INFO) << resource << ": the kubelet's plugin watcher unregistered us after "
            << absl::FormatDuration(absl::Now() - start);
  const std::string path = server->socket_path();
  if (server->OpenStreams() > 0) StopServing();  // the other stream ends
  // A successor on our former path, a WatcherProbe or a server of its own, is waiting for exactly
  // this.
  TellWatcherLetGo(path, absl::Milliseconds(250));
}

void ResourceRegistrar::StopStepping() {
  if (started_) {
    started_ = false;
    loop_->Remove(this);  // no step runs from here on
    // A call in flight is cancelled, and its callback must have run before the call's state is
    // freed.
    CancelRegister();
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
}

void ResourceRegistrar::Readvertise() {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr) server_->Readvertise();
}

bool ResourceRegistrar::registered() const {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr || !server_->SocketPresent()) return false;
  // Through the plugin watcher, a handover registration through kubelet.sock counts too.
  return machine_.registered_kubelet() ||
         (server_mode_ == RegistrationMode::kPluginWatcher && watcher_service_.registered());
}

uint64_t ResourceRegistrar::registrations() const {
  return machine_.registrations() + watcher_service_.registrations();
}

std::string ResourceRegistrar::socket_path() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? std::string() : server_->socket_path();
}

ArbiterDecision ResourceRegistrar::LookNow() {
  const NeighbourView view = Look(nullptr);
  machine_.NoteLook(view);
  const ArbiterInput input = machine_.InputFor(view);
  NeighbourArbiter arbiter(set_->resource_name(), options_.neighbour_grace);
  return arbiter.Decide(input, absl::Now());
}

// ---- RegistrationPorts ----

RegistrationMode ResourceRegistrar::EffectiveMode() {
  if (options_.mode != RegistrationMode::kAuto) return options_.mode;
  if (IsDirectory(DirectoryFor(RegistrationMode::kKubelet))) return RegistrationMode::kKubelet;
  if (IsDirectory(DirectoryFor(RegistrationMode::kPluginWatcher))) {
    return RegistrationMode::kPluginWatcher;
  }
  return RegistrationMode::kAuto;  // undecided: no kubelet yet
}

std::optional<KubeletSocketId> ResourceRegistrar::KubeletSocket() {
  struct stat st;
  if (stat(KubeletSocketPath().c_str(), &st) != 0) return std::nullopt;
  return KubeletSocketId{st.st_ino, static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 +
                                        st.st_ctim.tv_nsec};
}

bool ResourceRegistrar::KubeletAnswers() { return UnixSocketAnswers(KubeletSocketPath()); }

EndpointState ResourceRegistrar::Endpoint() {
  absl::MutexLock lock(&mu_);
  EndpointState state;
  if (server_ == nullptr) return state;
  state.serving = true;
  state.socket_present = server_->SocketPresent();
  state.open_streams = server_->OpenStreams();
  state.mode = server_mode_;
  state.path = server_->socket_path();
  return state;
}

absl::Status ResourceRegistrar::Serve(RegistrationMode mode) {
  const std::string path =
      absl::StrCat(DirectoryFor(mode), "/", SocketFileName(set_->resource_name()));
  const int stream_event_fd = stream_event_fd_;
  auto server = std::make_unique<PluginServer>(
      path, set_, &counters_, mode == RegistrationMode::kPluginWatcher ? &watcher_service_ : nullptr,
      options_.plugin, [stream_event_fd] {
        uint64_t one = 1;
        (void)!write(stream_event_fd, &one, sizeof(one));
      });
  if (absl::Status status = server->Start(); !status.ok()) return status;
  absl::MutexLock lock(&mu_);
  server_ = std::move(server);
  server_mode_ = mode;
  return absl::OkStatus();
}

void ResourceRegistrar::StopServing() {
  std::unique_ptr<PluginServer> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (server != nullptr) server->Stop();
}

void ResourceRegistrar::Silence() {
  absl::MutexLock lock(&mu_);
  if (server_ != nullptr) server_->Silence();
}

void ResourceRegistrar::StartRegister(const KubeletSocketId& kubelet) {
  const std::string resource = set_->resource_name();
  auto call = std::make_unique<RegisterCall>(KubeletSocketPath(), kubelet, resource,
                                             SocketFileName(resource), options_.plugin,
                                             options_.register_timeout);
  RegisterCall* raw = call.get();
  {
    absl::MutexLock lock(&mu_);
    call_ = std::move(call);
  }
  raw->Start(call_done_fd_);
}

absl::Status ResourceRegistrar::LinkForKubeletSock() {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return absl::FailedPreconditionError("not serving");
  return server_->LinkAlso(absl::StrCat(DirectoryFor(RegistrationMode::kKubelet), "/",
                                        SocketFileName(set_->resource_name())));
}

void ResourceRegistrar::CancelRegister() {
  absl::MutexLock lock(&mu_);
  if (call_ != nullptr) call_->Cancel();
}

void ResourceRegistrar::OurSocketPaths(std::string* serving_on, std::string* also) const {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  *serving_on = server_->socket_path();
  *also = server_->also_path();
}

NeighbourQuery ResourceRegistrar::NeighbourQueryNow() const {
  NeighbourQuery query;
  query.resource = set_->resource_name();
  query.device_plugin_dir = DirectoryFor(RegistrationMode::kKubelet);
  query.plugins_registry_dir = DirectoryFor(RegistrationMode::kPluginWatcher);
  query.pod_resources_socket = absl::StrCat(options_.kubelet_root, "/", kPodResourcesSocket);
  query.own_socket_name = SocketFileName(query.resource);
  OurSocketPaths(&query.serving_on, &query.also_serving_on);
  query.call_timeout = options_.neighbour_call_timeout;
  query.budget = options_.look_budget;
  return query;
}

NeighbourView ResourceRegistrar::Look(const NeighbourView* reuse_holdings_of) {
  NeighbourQuery query = NeighbourQueryNow();
  query.reuse_holdings_of = reuse_holdings_of;
  return LookAround(query);
}

std::vector<std::string> ResourceRegistrar::OwnIds() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&own_id_history_->mu);
    ids.assign(own_id_history_->ids.begin(), own_id_history_->ids.end());
  }
  // The snapshot is held by name: a range-for over `set_->Current()->devices` would drop the
  // temporary shared_ptr before the loop runs, and a concurrent Update could free the list.
  const std::shared_ptr<const Snapshot> current = set_->Current();
  for (const Device& device : current->devices) ids.push_back(device.id);
  return ids;
}

bool ResourceRegistrar::RecordSaysOurs() {
  absl::MutexLock lock(&record_mu_);
  return record_.RegisteredLast();
}

bool ResourceRegistrar::RecordSaysWatcher() {
  absl::MutexLock lock(&record_mu_);
  return record_.RegisteredVia() != RegistrationModeName(RegistrationMode::kKubelet);
}

absl::Status ResourceRegistrar::Record(bool ours, RegistrationMode via) {
  absl::MutexLock lock(&record_mu_);
  return record_.Set(ours, std::string(RegistrationModeName(via)));
}

absl::Status ResourceRegistrar::StartWatcherProbe() {
  const std::string directory = DirectoryFor(RegistrationMode::kPluginWatcher);
  if (!IsDirectory(directory)) return absl::NotFoundError(absl::StrCat(directory, " is not there"));
  const int probe_asked_fd = probe_asked_fd_;
  auto probe = std::make_unique<WatcherProbe>(
      absl::StrCat(directory, "/", SocketFileName(set_->resource_name())), [probe_asked_fd] {
        uint64_t one = 1;
        (void)!write(probe_asked_fd, &one, sizeof(one));
      });
  if (absl::Status status = probe->Start(); !status.ok()) return status;
  absl::MutexLock lock(&mu_);
  probe_ = std::move(probe);
  return absl::OkStatus();
}

void ResourceRegistrar::StopWatcherProbe() {
  std::unique_ptr<WatcherProbe> probe;
  {
    absl::MutexLock lock(&mu_);
    probe = std::move(probe_);
  }
  if (probe != nullptr) probe->Stop();
}

void ResourceRegistrar::Warn(const std::string& reason, const std::string& message) {
  if (options_.warn) options_.warn(reason, message);
}

// ---- The registration thread ----

PollLoop::Fds ResourceRegistrar::WaitFds() {
  if (!set_up_) return {-1, -1, -1, -1};
  return {inotify_.fd(), call_done_fd_, stream_event_fd_, probe_asked_fd_};
}

absl::Time ResourceRegistrar::Step(const PollLoop::Events& ready) {
  if (!set_up_) {
    if (!SetUp()) return absl::Now() + set_up_backoff_.Next();
    set_up_ = true;
  } else {
    Receive(ready);
  }
  // Re-armed each time: a directory may have appeared, or been re-created.
  inotify_.Arm({DirectoryFor(RegistrationMode::kKubelet),
                DirectoryFor(RegistrationMode::kPluginWatcher)});
  absl::Time wake = machine_.Step();
  if (!inotify_.complete()) {
    // Some directory cannot be watched: look again every second rather than miss a kubelet.
    wake = std::min(wake, absl::Now() + absl::Seconds(1));
  }
  return wake;
}

void ResourceRegistrar::Receive(const PollLoop::Events& ready) {
  if (std::all_of(ready.begin(), ready.end(), [](short revents) { return revents == 0; })) {
    return;  // the wake time came
  }
  if (ready[1] & POLLIN) {
    uint64_t count;
    (void)!read(call_done_fd_, &count, sizeof(count));
    std::unique_ptr<RegisterCall> call;
    {
      absl::MutexLock lock(&mu_);
      call = std::move(call_);
    }
    if (call != nullptr) machine_.RegisterDone(call->Outcome());
  }
  if (ready[2] & POLLIN) {
    uint64_t count;
    (void)!read(stream_event_fd_, &count, sizeof(count));
    machine_.StreamEnded();
  }
  if (ready[3] & POLLIN) {
    uint64_t count;
    (void)!read(probe_asked_fd_, &count, sizeof(count));
    machine_.WatcherProbeAsked();
  }
  bool rearm = false;
  std::vector<DirectoryWatcher::Event> events = inotify_.Drain(&rearm);
  // Sockets came or went, or the kubelet wrote its checkpoint (it does on every device list it
  // receives).
  std::string serving_on, also_serving_on;
  OurSocketPaths(&serving_on, &also_serving_on);
  for (const DirectoryWatcher::Event& event : events) {
    if (event.name == kKubeletSocketName) continue;
    const std::string path =
        absl::StrCat(DirectoryFor(event.directory == 0 ? RegistrationMode::kKubelet
                                                       : RegistrationMode::kPluginWatcher),
                     "/", event.name);
    if (path == serving_on || path == also_serving_on) continue;
    machine_.NeighbourChanged();
  }
  // Events may have been lost (overflow, a directory re-created): compare with what we know.
  if (rearm || !inotify_.complete()) machine_.EventsMissed();
  for (const DirectoryWatcher::Event& event : events) {
    if (event.directory != 0 || event.name != kKubeletSocketName) continue;
    if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
      machine_.KubeletSocketCreated();
    } else if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
      machine_.KubeletSocketRemoved();
    }
  }
}

}  // namespace edgeaccel
