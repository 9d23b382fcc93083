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

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(100);
// The least time between two looks at the neighbours: a directory that never settles must not
// turn the look into a busy loop.
constexpr absl::Duration kLookInterval = absl::Milliseconds(20);
// While registered, how long after an event that may mean another plugin registered the
// resource we look: its first ListAndWatch answer must have reached the kubelet.
constexpr absl::Duration kLookSettle = absl::Milliseconds(100);
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
      backoff_(kInitialBackoff, options_.max_backoff, /*jitter=*/0.2),
      arbiter_(set->resource_name(), options_.neighbour_grace),
      record_(options_.keep_record
                  ? absl::StrCat(options_.device_plugin_dir, "/", kRegistrationRecordDir)
                  : "",
              set->resource_name()) {
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
    start_failures_.fetch_add(1);
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
  registration_failures_.fetch_add(1);
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
    // One of our streams ended: look once the kubelet has made its next move (or, stepped
    // back, the silenced stream we kept for the kubelet ended).
    check_endpoint_at_ = std::min(check_endpoint_at_, absl::Now() + options_.lost_endpoint_settle);
    recheck_other_ = true;
  }
  bool rearm = false;
  std::vector<DirectoryWatcher::Event> events = inotify_.Drain(&rearm);
  // Sockets came or went, or the kubelet wrote its checkpoint (it does on every device list it
  // receives): whoever we left the resource to may be gone or back, or while we serve, another
  // plugin may have registered the resource.
  std::string serving_on;
  {
    absl::MutexLock lock(&mu_);
    if (server_ != nullptr) serving_on = server_->socket_path();
  }
  for (const DirectoryWatcher::Event& event : events) {
    if (event.name == kKubeletSocketName) continue;
    const std::string path =
        absl::StrCat(DirectoryFor(event.directory == 0 ? RegistrationMode::kKubelet
                                                       : RegistrationMode::kPluginWatcher),
                     "/", event.name);
    if (path == serving_on) continue;
    recheck_other_ = true;
    if (look_at_ == absl::InfiniteFuture()) look_at_ = absl::Now() + kLookSettle;
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
      if (registered_kubelet_.exchange(false)) {
        LOG(INFO) << set_->resource_name() << ": " << KubeletSocket()
                  << " went: the kubelet has stopped; registering again when it is back";
      }
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
  if (server != nullptr) {
    NoteWatcherSocketGoing(*server);
    server->Stop();
  }
  registered_kubelet_.store(false);
  watcher_service_.EndpointLost();
}

void ResourceRegistrar::NoteWatcherSocketGoing(const PluginServer& server) {
  // The plugin watcher deregisters a removed socket by resource name on its next pass, and
  // would disconnect a kubelet.sock registration made before it (Options::watcher_pass).
  if (active_mode_ == RegistrationMode::kPluginWatcher &&
      (watcher_service_.registered() || server.OpenStreams() > 0)) {
    watcher_socket_gone_at_ = absl::Now();
  }
}

NeighbourQuery ResourceRegistrar::NeighbourQueryNow() const {
  NeighbourQuery query;
  query.resource = set_->resource_name();
  query.device_plugin_dir = DirectoryFor(RegistrationMode::kKubelet);
  query.plugins_registry_dir = DirectoryFor(RegistrationMode::kPluginWatcher);
  query.pod_resources_socket = absl::StrCat(options_.kubelet_root, "/", kPodResourcesSocket);
  query.own_socket_name = SocketFileName(query.resource);
  {
    absl::MutexLock lock(&mu_);
    if (server_ != nullptr) query.serving_on = server_->socket_path();
  }
  query.call_timeout = options_.neighbour_call_timeout;
  query.budget = options_.look_budget;
  return query;
}

bool ResourceRegistrar::RegisteredNow() const {
  return registered_kubelet_.load() || watcher_service_.registered();
}

NeighbourView ResourceRegistrar::Look() const {
  NeighbourView view = LookAround(NeighbourQueryNow());
  absl::MutexLock lock(&mu_);
  holdings_source_ = view.holdings_read ? view.holdings.source : "";
  return view;
}

ArbiterInput ResourceRegistrar::InputFor(const NeighbourView& view) const {
  ArbiterInput input;
  input.view = &view;
  {
    absl::MutexLock lock(&own_id_history_->mu);
    input.own_ids.assign(own_id_history_->ids.begin(), own_id_history_->ids.end());
  }
  // The snapshot is held by name: a range-for over `set_->Current()->devices` would drop the
  // temporary shared_ptr before the loop runs, and a concurrent Update could free the list.
  const std::shared_ptr<const Snapshot> current = set_->Current();
  for (const Device& device : current->devices) input.own_ids.push_back(device.id);
  input.registered = RegisteredNow() && left_to().empty();
  input.registered_last = record_.RegisteredLast();
  input.take_over = options_.take_over;
  return input;
}

ArbiterDecision ResourceRegistrar::LookNow() const {
  const NeighbourView view = Look();
  const ArbiterInput input = InputFor(view);
  NeighbourArbiter arbiter(set_->resource_name(), options_.neighbour_grace);
  return arbiter.Decide(input, absl::Now());
}

std::string ResourceRegistrar::holdings_source() const {
  absl::MutexLock lock(&mu_);
  return holdings_source_;
}

bool ResourceRegistrar::Arbitrate() {
  last_other_look_ = absl::Now();
  const std::string resource = set_->resource_name();
  const NeighbourView view = Look();
  // Counted once its verdict is acted on, so a test that waits for the count sees the outcome.
  absl::Cleanup counted = [this] { neighbour_looks_.fetch_add(1); };
  if (absl::ToInt64Nanoseconds(view.took) > longest_look_ns_.load()) {
    longest_look_ns_.store(absl::ToInt64Nanoseconds(view.took));
  }
  if (view.out_of_budget) {
    Complain(absl::StrCat(resource, ": looking at other plugins took its whole budget (",
                          absl::FormatDuration(options_.look_budget),
                          "); sockets that did not answer in time were not counted"));
  }
  if (!view.holdings_read) {
    holdings_unreadable_.fetch_add(1);
    holdings_warnings_.Warn(absl::StrCat(
        resource, ": cannot tell what the kubelet holds (", view.holdings_note,
        "); deciding from the other plugins' sockets alone. Mount <kubelet-root>/pod-resources "
        "into the pod so the kubelet can be asked."));
  } else if (!view.holdings_note.empty()) {
    holdings_warnings_.Warn(absl::StrCat(
        resource, ": the pod-resources API did not answer (", view.holdings_note,
        "); reading the kubelet's checkpoint instead, which is stale once a plugin disconnects"));
  }
  if (!view.checkpoint_problem.empty()) {
    checkpoint_unreadable_.fetch_add(1);
    checkpoint_warnings_.Warn(absl::StrCat(
        resource, ": the kubelet's checkpoint has a shape this edgeaccel does not know (",
        view.checkpoint_problem, "); what it could not read is left out"));
  }
  const std::string was_left_to = left_to();
  const ArbiterInput input = InputFor(view);
  const ArbiterDecision decision = arbiter_.Decide(input, absl::Now());
  VLOG(1) << resource << ": neighbour look took " << absl::FormatDuration(view.took) << " ("
          << (view.holdings_read ? view.holdings.source : "no holdings") << "): "
          << VerdictName(decision.verdict) << (decision.why.empty() ? "" : ": ") << decision.why;

  if (decision.verdict == ArbiterDecision::kServe) {
    recheck_other_at_ = absl::InfiniteFuture();
    if (!was_left_to.empty()) {
      LOG(INFO) << resource << ": " << (decision.why.empty() ? "no other plugin serves it now"
                                                             : decision.why)
                << "; serving and registering it";
      // A silenced server kept for its open stream goes now: the plugin we left it to is gone.
      StopServing();
      absl::MutexLock lock(&mu_);
      left_to_.clear();
    } else if (options_.take_over && !decision.why.empty() &&
               (!view.registry_claim.empty() || view.live_foreign_sockets > 0)) {
      Complain("registering it even where another plugin may serve it, as --take-over asks");
    }
    watcher_service_.SetSteppedBack(false);
    if (predecessor_was_watcher_) {
      // Our predecessor registered through the plugin watcher: its deregistration by name, on
      // the watcher's next pass, would disconnect us if we registered first.
      predecessor_was_watcher_ = false;
      watcher_socket_gone_at_ = absl::Now();
    }
    return false;
  }

  if (decision.verdict == ArbiterDecision::kStepBack) {
    // Another plugin registered it after us. Our stream stays open and silent: ending it would
    // make a kubelet 1.25-1.36 disconnect that plugin (runClient disconnects the current client).
    {
      absl::MutexLock lock(&mu_);
      if (server_ != nullptr) server_->Silence();
      left_to_ = decision.to;
    }
    CancelRegisterCall();
    registered_kubelet_.store(false);
    watcher_service_.EndpointLost();
    watcher_service_.SetSteppedBack(true);
    if (absl::Status status = record_.Set(false); !status.ok()) Complain(std::string(status.message()));
    Warn("DevicePluginSteppedBack",
         absl::StrCat(resource, ": stepped back: ", decision.why,
                      "; start with --take-over to serve it from edgeaccel"));
    LOG(WARNING) << resource << ": stepping back: " << decision.why
                 << ". edgeaccel sends nothing more for " << resource
                 << " (its stream stays open, silent) and leaves it to that plugin; to serve it "
                    "from edgeaccel instead, remove that plugin or pass --take-over="
                 << resource;
    return true;
  }

  // Leave or wait: not serving. A server left from before goes (its socket too), unless it is a
  // silenced one still holding the stream the kubelet replaced.
  bool silenced_server;
  {
    absl::MutexLock lock(&mu_);
    silenced_server = server_ != nullptr && !was_left_to.empty() && server_->OpenStreams() > 0;
    left_to_ = decision.to;
  }
  if (!silenced_server) StopServing();
  watcher_service_.SetSteppedBack(true);
  predecessor_was_watcher_ =
      !view.predecessor.empty() &&
      absl::StartsWith(view.predecessor, DirectoryFor(RegistrationMode::kPluginWatcher) + "/");
  recheck_other_at_ = decision.verdict == ArbiterDecision::kWait ? decision.until
                                                                 : absl::InfiniteFuture();
  if (was_left_to != decision.to) {
    if (view.predecessor.empty()) {
      if (absl::Status status = record_.Set(false); !status.ok()) {
        Complain(std::string(status.message()));
      }
      Warn("DevicePluginTakeoverRefused",
           absl::StrCat(resource, ": not registered: ", decision.why,
                        "; start with --take-over to replace it"));
    }
    LOG(WARNING) << resource << ": not registering it: " << decision.why
                 << (view.predecessor.empty()
                         ? absl::StrCat(". To serve it from edgeaccel instead, remove that plugin "
                                        "or pass --take-over=",
                                        resource)
                         : "");
  }
  return true;
}

void ResourceRegistrar::RecordOurs() {
  if (record_.RegisteredLast()) return;
  if (absl::Status status = record_.Set(true); !status.ok()) {
    Complain(absl::StrCat(status.message(), " (the registration record: after a reboot we may "
                                            "wait --neighbour-grace for our own resource)"));
  }
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
  if (Arbitrate()) return;
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

    // 0. Left to another plugin (or waiting for one): look again when something changed (at
    //    most every kLookInterval, and once more a moment later, since the kubelet acts on a
    //    stream's end or a new plugin's first list a little after the socket event), and when
    //    the grace for a plugin that served it before runs out.
    if (!left_to().empty()) {
      if (recheck_other_) {
        const absl::Time now = absl::Now();
        recheck_other_at_ =
            std::min(recheck_other_at_, std::max(now, last_other_look_ + kLookInterval));
        settle_look_at_ = now + kLookSettle;
      }
      recheck_other_ = false;
      look_at_ = absl::InfiniteFuture();
      if (absl::Now() >= settle_look_at_) {
        settle_look_at_ = absl::InfiniteFuture();
        recheck_other_at_ = absl::InfinitePast();
      }
      {
        // The silenced stream we kept after stepping back has ended (the kubelet restarted):
        // nothing holds the old server any more.
        absl::MutexLock lock(&mu_);
        if (server_ != nullptr && server_->OpenStreams() == 0) recheck_other_at_ = absl::InfinitePast();
      }
      if (absl::Now() >= recheck_other_at_) {
        recheck_other_at_ = absl::InfiniteFuture();
        Arbitrate();
      }
      if (!left_to().empty()) {
        const absl::Time next = std::min(recheck_other_at_, settle_look_at_);
        Wait(next == absl::InfiniteFuture() ? kUntilEvent : next - absl::Now());
        continue;
      }
    }
    recheck_other_ = false;

    // 0b. Registered: an event that may mean another plugin registered the resource after us
    //     (a new socket, the kubelet's checkpoint rewritten) is looked into once it settles.
    if (look_at_ != absl::InfiniteFuture() && absl::Now() >= look_at_) {
      look_at_ = absl::InfiniteFuture();
      if (RegisteredNow() && Arbitrate()) continue;
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
      CancelRegisterCall();  // a Register naming the vanished socket cannot succeed
      NoteWatcherSocketGoing(*stale);
      stale->Stop();
      registered_kubelet_.store(false);
    }
    if (!serving) {
      if (absl::Now() < retry_at_) {
        Wait(retry_at_ - absl::Now());
        continue;
      }
      // Never take a resource another plugin serves (unless told to).
      if (Arbitrate()) continue;
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
      // From here the kubelet may register us at any moment (the plugin watcher) or is about to
      // (kubelet.sock): the resource is ours from now on, should we restart before it answers.
      RecordOurs();
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
      } else if (absl::Now() < watcher_socket_gone_at_ + options_.watcher_pass) {
        // Our plugin-watcher registration (or our predecessor's) has just gone: let the
        // watcher's deregistration by name pass before we register, or it disconnects us.
        retry_at_ = watcher_socket_gone_at_ + options_.watcher_pass;
        wait = retry_at_ - absl::Now();
      } else if (!Arbitrate()) {
        StartRegisterCall(*kubelet);
      } else {
        continue;
      }
    }
    for (absl::Time at : {check_endpoint_at_, look_at_}) {
      if (at == absl::InfiniteFuture()) continue;
      const absl::Duration until = at - absl::Now();
      wait = wait == kUntilEvent ? until : std::min(wait, until);
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
