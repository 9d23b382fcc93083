#include "dra_kubelet.h"

#include <dirent.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"
#include "fixture_host.h"

namespace edgeaccel::testing {
namespace {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

// Plugin type and service names (k8s.io/kubelet constants.go, dra/v1 and v1beta1 types.go,
// dra/v1alpha4 types.go).
constexpr char kDraPluginType[] = "DRAPlugin";
constexpr char kV1Service[] = "v1.DRAPlugin";
constexpr char kV1beta1Service[] = "v1beta1.DRAPlugin";
constexpr char kV1alpha4Service[] = "v1alpha3.NodeService";
// The v1alpha4 API's gRPC service for its methods (proto package v1alpha3, service Node). Its
// requests are wire-identical to v1beta1's; the double only needs them to fail as the real calls
// do against a plugin that does not serve them.
constexpr char kV1alpha4Node[] = "v1alpha3.Node";

// operation_generator.go
constexpr absl::Duration kDialTimeout = absl::Seconds(10);
constexpr absl::Duration kGetInfoTimeout = absl::Seconds(1);
constexpr absl::Duration kNotifyTimeout = absl::Seconds(5);
// goroutinemap/exponentialbackoff: initialDurationBeforeRetry, maxDurationBeforeRetry.
constexpr absl::Duration kInitialBackoff = absl::Milliseconds(500);
const absl::Duration kMaxBackoff = absl::Minutes(2) + absl::Seconds(2);

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

// Go's codes.Code.String().
std::string GoCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "Canceled";
    case grpc::StatusCode::UNKNOWN: return "Unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::StatusCode::NOT_FOUND: return "NotFound";
    case grpc::StatusCode::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::StatusCode::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::StatusCode::ABORTED: return "Aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "OutOfRange";
    case grpc::StatusCode::UNIMPLEMENTED: return "Unimplemented";
    case grpc::StatusCode::INTERNAL: return "Internal";
    case grpc::StatusCode::UNAVAILABLE: return "Unavailable";
    case grpc::StatusCode::DATA_LOSS: return "DataLoss";
    case grpc::StatusCode::UNAUTHENTICATED: return "Unauthenticated";
    default: return absl::StrCat("Code(", static_cast<int>(code), ")");
  }
}

// A gRPC status error as Go prints it (status.Error).
// A client-side deadline reads "context deadline exceeded" in Go.
std::string GoError(const grpc::Status& status) {
  const bool deadline = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                        status.error_message() == "Deadline Exceeded";
  return absl::StrCat("rpc error: code = ", GoCodeName(status.error_code()), " desc = ",
                      deadline ? "context deadline exceeded" : status.error_message());
}

// Go's %q of a []string: ["a" "b"].
std::string GoQuoted(const std::vector<std::string>& list) {
  std::vector<std::string> quoted;
  for (const std::string& s : list) quoted.push_back(absl::StrCat("\"", s, "\""));
  return absl::StrCat("[", absl::StrJoin(quoted, " "), "]");
}

std::string Basename(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A channel of its own (no subchannel shared with another channel, as each Go ClientConn has
// its own), with gRPC's default reconnect backoff (1 s, x1.6, up to 120 s: the same as Go's).
std::shared_ptr<grpc::Channel> Dial(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", path), grpc::InsecureChannelCredentials(),
                                   args);
}

template <typename Claims>
void FillClaims(const std::vector<DraKubelet::Claim>& claims, Claims* out) {
  for (const DraKubelet::Claim& claim : claims) {
    auto* c = out->Add();
    c->set_namespace_(claim.namespace_);
    c->set_name(claim.name);
    c->set_uid(claim.uid);
  }
}

DraKubelet::PreparedDevice FromProto(const drav1::Device& d) {
  DraKubelet::PreparedDevice out;
  out.request_names.assign(d.request_names().begin(), d.request_names().end());
  out.pool = d.pool_name();
  out.device = d.device_name();
  out.cdi_device_ids.assign(d.cdi_device_ids().begin(), d.cdi_device_ids().end());
  if (d.has_share_id()) out.share_id = d.share_id();
  return out;
}

DraKubelet::PreparedDevice FromProto(const drav1beta1::Device& d) {
  DraKubelet::PreparedDevice out;
  out.request_names.assign(d.request_names().begin(), d.request_names().end());
  out.pool = d.pool_name();
  out.device = d.device_name();
  out.cdi_device_ids.assign(d.cdi_device_ids().begin(), d.cdi_device_ids().end());
  return out;
}

template <typename Response>
void FromProto(const Response& response, DraKubelet::PrepareAnswer* answer) {
  for (const auto& [uid, result] : response.claims()) {
    DraKubelet::ClaimResult& out = answer->claims[uid];
    out.error = result.error();
    for (const auto& device : result.devices()) out.devices.push_back(FromProto(device));
  }
}

template <typename Response>
void FromProto(const Response& response, DraKubelet::UnprepareAnswer* answer) {
  for (const auto& [uid, result] : response.claims()) answer->claims[uid] = result.error();
}

std::string HealthName(v1alpha1::HealthStatus health) {
  switch (health) {
    case v1alpha1::HEALTHY: return "Healthy";
    case v1alpha1::UNHEALTHY: return "Unhealthy";
    default: return "Unknown";
  }
}

}  // namespace

std::string DraKubeletGenerationName(DraKubeletGeneration generation) {
  return generation == DraKubeletGeneration::kV1_33 ? "1.33" : "1.36";
}

std::optional<DraKubeletGeneration> ParseDraKubeletGeneration(const std::string& text) {
  std::string t = absl::StartsWith(text, "v") ? text.substr(1) : text;
  if (t == "1.32" || t == "1.33") return DraKubeletGeneration::kV1_33;
  if (t == "1.34" || t == "1.35" || t == "1.36") return DraKubeletGeneration::kV1_36;
  return std::nullopt;
}

// One registered plugin instance: DRAPlugin (dra_plugin.go) with its connection, the
// monitoredPlugin's connected flag and its health stream.
struct DraKubelet::Instance {
  Registration registration;
  std::shared_ptr<grpc::Channel> channel;
  bool connected = false;  // guarded by the kubelet's mu_

  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* health_context ABSL_GUARDED_BY(mu) = nullptr;

  std::thread connection_watcher;
  std::thread health;

  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
    if (health_context != nullptr) health_context->TryCancel();
  }
  bool Cancelled() {
    absl::MutexLock lock(&mu);
    return cancelled;
  }
  // Sleeps `d` unless cancelled first; true if cancelled.
  bool SleepUnlessCancelled(absl::Duration d) {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&cancelled), d);
    return cancelled;
  }
  void Join() {
    if (connection_watcher.joinable()) connection_watcher.join();
    if (health.joinable()) health.join();
  }
};

// goroutinemap's entry for one socket: one operation at a time, exponential backoff on error.
struct DraKubelet::Operation {
  bool pending = false;
  absl::Duration backoff = absl::ZeroDuration();  // durationBeforeRetry; 0: no error since success
  absl::Time last_error;
  std::thread thread;
};

DraKubelet::DraKubelet(std::string root, DraKubeletOptions options)
    : root_(std::move(root)), options_(std::move(options)) {}

DraKubelet::~DraKubelet() { Stop(); }

void DraKubelet::Event(const std::string& line) {
  std::function<void(const std::string&)> callback;
  {
    absl::MutexLock lock(&mu_);
    events_.push_back(line);
    callback = on_event_;
    Changed();
  }
  if (callback) callback(line);
}

void DraKubelet::OnEvent(std::function<void(const std::string&)> callback) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(callback);
}

void DraKubelet::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return;
    running_ = true;
  }
  // Watcher.init: MkdirAll(plugins_registry, 0755).
  const std::string dir = PluginsRegistryDir();
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    mkdir(dir.substr(0, slash).c_str(), 0755);
    if (slash == std::string::npos) break;
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  // Watcher.Start: the directory is watched and walked before Start returns, and only then does
  // the goroutine that handles the events begin (pluginwatcher/plugin_watcher.go). A plugin
  // started after Start() is seen once, by its create event: a walk still under way could see it
  // a second time, with a later timestamp, and the reconciler would register it again.
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  std::map<int, std::string> watches;
  AddWatchTree(fd, PluginsRegistryDir(), &watches);
  Event(absl::StrCat("watching ", PluginsRegistryDir(), " (kubelet ",
                     DraKubeletGenerationName(options_.generation), ")"));
  watcher_ = std::thread([this, fd, watches = std::move(watches)]() mutable {
    WatchLoop(fd, std::move(watches));
  });
}

void DraKubelet::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
  }
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  if (watcher_.joinable()) watcher_.join();
  close(stop_fd_);
  stop_fd_ = -1;
  // Operations under way finish (a dial gives up at once: running_ is false).
  std::vector<std::thread*> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [socket, op] : operations_) {
      if (op->thread.joinable()) threads.push_back(&op->thread);
    }
  }
  for (std::thread* thread : threads) thread->join();
  // The process is gone: every connection drops, memory is lost.
  std::vector<std::shared_ptr<Instance>> instances;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [driver, list] : store_) {
      for (auto& instance : list) instances.push_back(instance);
    }
    for (auto& instance : retired_) instances.push_back(instance);
    store_.clear();
    retired_.clear();
    operations_.clear();
    desired_.clear();
    actual_.clear();
    health_.clear();
    Changed();
  }
  for (auto& instance : instances) instance->Cancel();
  for (auto& instance : instances) instance->Join();
  Event("stopped");
}

// --- plugin watcher and reconciler ---

void DraKubelet::AddWatchTree(int fd, const std::string& dir, std::map<int, std::string>* watches) {
  // traversePluginDir: watch the directory, then walk it.
  int wd = inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_DELETE);
  if (wd >= 0) (*watches)[wd] = dir;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> entries;
  while (struct dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") entries.push_back(dir + "/" + name);
  }
  closedir(d);
  std::sort(entries.begin(), entries.end());
  for (const std::string& path : entries) {
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      AddWatchTree(fd, path, watches);
    } else if (S_ISSOCK(st.st_mode)) {
      HandleCreate(fd, path, watches);
    } else {
      Event(absl::StrCat("ignored ", path, " (not a socket)"));
    }
  }
}

void DraKubelet::HandleCreate(int fd, const std::string& path,
                              std::map<int, std::string>* watches) {
  // handleCreateEvent: os.Stat, names starting with '.' ignored, directories walked, non-sockets
  // ignored, a socket goes into the desired state with the time now (AddOrUpdatePlugin).
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;
  if (absl::StartsWith(Basename(path), ".")) {
    Event(absl::StrCat("ignored ", path, " (starts with '.')"));
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    AddWatchTree(fd, path, watches);
    return;
  }
  if (!S_ISSOCK(st.st_mode)) {
    Event(absl::StrCat("ignored ", path, " (not a socket)"));
    return;
  }
  absl::MutexLock lock(&mu_);
  desired_[path] = absl::Now();
  Changed();
}

void DraKubelet::WatchLoop(int fd, std::map<int, std::string> watches) {
  absl::Time next_pass = absl::Now();
  while (true) {
    if (absl::Now() >= next_pass) {
      Reconcile();
      next_pass = absl::Now() + options_.reconcile_period;
    }
    struct pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next_pass - absl::Now()) + 1));
    if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) break;
    alignas(struct inotify_event) char buffer[4096];
    ssize_t len;
    while ((len = read(fd, buffer, sizeof(buffer))) > 0) {
      for (char* p = buffer; p < buffer + len;) {
        auto* event = reinterpret_cast<struct inotify_event*>(p);
        p += sizeof(struct inotify_event) + event->len;
        if (event->mask & IN_IGNORED) {
          watches.erase(event->wd);
          continue;
        }
        auto dir = watches.find(event->wd);
        if (dir == watches.end() || event->len == 0) continue;
        const std::string path = dir->second + "/" + event->name;
        if (event->mask & (IN_CREATE | IN_MOVED_TO)) {
          HandleCreate(fd, path, &watches);
        } else if (event->mask & IN_DELETE) {
          // handleDeleteEvent: RemovePlugin from the desired state, whatever the path was.
          absl::MutexLock lock(&mu_);
          desired_.erase(path);
          Changed();
        }
      }
    }
  }
  close(fd);
}

void DraKubelet::Reconcile() {
  std::vector<std::shared_ptr<Instance>> retired;
  {
    absl::MutexLock lock(&mu_);
    // Unregistrations first: socket gone, or re-created (another timestamp).
    for (const auto& [socket, entry] : actual_) {
      auto desired = desired_.find(socket);
      if (desired == desired_.end() || desired->second != entry.timestamp) {
        RunOperation(socket, [this, socket = socket] { return UnregisterOperation(socket); });
      }
    }
    for (const auto& [socket, timestamp] : desired_) {
      auto actual = actual_.find(socket);
      if (actual == actual_.end() || actual->second.timestamp != timestamp) {
        RunOperation(socket, [this, socket = socket, timestamp = timestamp] {
          return RegisterOperation(socket, timestamp);
        });
      }
    }
    retired = std::move(retired_);
    retired_.clear();
  }
  for (auto& instance : retired) instance->Join();
}

void DraKubelet::RunOperation(const std::string& socket, std::function<absl::Status()> body) {
  std::unique_ptr<Operation>& op = operations_[socket];
  if (op == nullptr) op = std::make_unique<Operation>();
  if (op->pending) return;  // AlreadyExists
  if (op->backoff > absl::ZeroDuration() && absl::Now() < op->last_error + op->backoff) return;
  if (op->thread.joinable()) op->thread.join();  // finished: it set pending = false last
  op->pending = true;
  op->thread = std::thread([this, socket, body = std::move(body)] {
    absl::Status status = body();
    absl::MutexLock lock(&mu_);
    Operation* op = operations_[socket].get();
    op->pending = false;
    if (status.ok()) {
      op->backoff = absl::ZeroDuration();
    } else {
      op->backoff = op->backoff == absl::ZeroDuration() ? kInitialBackoff
                                                        : std::min(op->backoff * 2, kMaxBackoff);
      op->last_error = absl::Now();
    }
    Changed();
  });
}

absl::Status DraKubelet::UnregisterOperation(const std::string& socket) {
  AswEntry entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = actual_.find(socket);
    if (it == actual_.end()) return absl::OkStatus();
    entry = it->second;
    actual_.erase(it);
    Changed();
  }
  if (entry.dra) DeRegisterPlugin(entry.name, entry.endpoint);
  return absl::OkStatus();
}

absl::Status DraKubelet::RegisterOperation(const std::string& socket, absl::Time timestamp) {
  auto fail = [&](const std::string& error) {
    {
      absl::MutexLock lock(&mu_);
      registration_errors_.push_back(error);
    }
    Event(absl::StrCat("registration failed ", socket, ": ", error));
    return absl::UnknownError(error);
  };
  // dial: blocking, 10 s.
  std::shared_ptr<grpc::Channel> channel = Dial(socket);
  const absl::Time dial_deadline = absl::Now() + kDialTimeout;
  while (!channel->WaitForConnected(In(std::min(absl::Milliseconds(100),
                                                dial_deadline - absl::Now())))) {
    {
      absl::MutexLock lock(&mu_);
      if (!running_) return absl::CancelledError("kubelet stopping");
    }
    if (absl::Now() >= dial_deadline) {
      return fail(absl::StrCat("RegisterPlugin error -- dial failed at socket ", socket,
                               ", err: failed to dial socket ", socket,
                               ", err: context deadline exceeded"));
    }
  }
  auto client = pluginregistration::Registration::NewStub(channel);
  pluginregistration::PluginInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(In(kGetInfoTimeout));
    {
      absl::MutexLock lock(&mu_);
      get_info_calls_[socket]++;
    }
    Event(absl::StrCat("GetInfo ", socket));
    grpc::Status status = client->GetInfo(&context, pluginregistration::InfoRequest(), &info);
    if (!status.ok()) {
      return fail(absl::StrCat("RegisterPlugin error -- failed to get plugin info using RPC "
                               "GetInfo at socket ", socket, ", err: ", GoError(status)));
    }
  }
  // notifyPlugin: the error it returns is the notify RPC's, or errStr itself when non-empty.
  auto notify = [&](bool registered, const std::string& error) -> std::string {
    if (!registered) {
      absl::MutexLock lock(&mu_);
      refusals_.push_back(error);
    }
    Event(registered ? absl::StrCat("NotifyRegistrationStatus ", socket, " registered")
                     : absl::StrCat("refused ", socket, ": ", error));
    grpc::ClientContext context;
    context.set_deadline(In(kNotifyTimeout));
    pluginregistration::RegistrationStatus request;
    request.set_plugin_registered(registered);
    request.set_error(error);
    pluginregistration::RegistrationStatusResponse ignored;
    grpc::Status status = client->NotifyRegistrationStatus(&context, request, &ignored);
    if (!status.ok()) return absl::StrCat(error, ": ", GoError(status));
    return error;
  };
  const std::vector<std::string> versions(info.supported_versions().begin(),
                                          info.supported_versions().end());
  if (info.type() != kDraPluginType) {
    if (options_.other_handler_types.count(info.type()) > 0) {
      // Another handler's plugin (device manager, CSI): not modelled here, and not refused.
      {
        absl::MutexLock lock(&mu_);
        actual_[socket] = AswEntry{timestamp, info.type(), info.name(), info.endpoint(), false};
        Changed();
      }
      Event(absl::StrCat("passed on ", socket, " (type ", info.type(), ", another handler's)"));
      return absl::OkStatus();
    }
    const std::string error =
        absl::StrCat("RegisterPlugin error -- no handler registered for plugin type: ",
                     info.type(), " at socket ", socket);
    const std::string sent = notify(false, error);
    return fail(absl::StrCat("RegisterPlugin error -- failed to send error at socket ", socket,
                             ", err: ", sent));
  }
  const std::string endpoint = info.endpoint().empty() ? socket : info.endpoint();
  if (absl::Status valid = ValidatePlugin(info.name(), endpoint, versions); !valid.ok()) {
    const std::string sent = notify(
        false, absl::StrCat("RegisterPlugin error -- plugin validation failed with err: ",
                            valid.message()));
    return fail(absl::StrCat("RegisterPlugin error -- failed to send error at socket ", socket,
                             ", err: ", sent));
  }
  // In the actual state before the handler's RegisterPlugin: a failure from here on is not
  // retried until the socket is re-created.
  {
    absl::MutexLock lock(&mu_);
    actual_[socket] = AswEntry{timestamp, info.type(), info.name(), endpoint, true};
    Changed();
  }
  if (absl::Status registered = RegisterPlugin(info.name(), endpoint, versions, socket);
      !registered.ok()) {
    return fail(notify(false, absl::StrCat("RegisterPlugin error -- plugin registration failed "
                                           "with err: ", registered.message())));
  }
  const std::string sent = notify(true, "");
  if (!sent.empty()) {
    return fail(absl::StrCat("RegisterPlugin error -- failed to send registration status at "
                             "socket ", socket, ", err: ", sent));
  }
  return absl::OkStatus();
}

// --- the DRA handler ---

absl::StatusOr<std::string> DraKubelet::ValidateSupportedServices(
    const std::vector<std::string>& services) {
  if (services.empty()) {
    return absl::InvalidArgumentError(
        "empty list of supported gRPC services (aka supported versions)");
  }
  if (options_.generation == DraKubeletGeneration::kV1_33) {
    // The kubelet's order, v1alpha4 when neither is advertised.
    for (const char* service : {kV1beta1Service, kV1alpha4Service}) {
      if (std::find(services.begin(), services.end(), service) != services.end()) return service;
    }
    return std::string(kV1alpha4Service);
  }
  // The plugin's order.
  const std::vector<std::string> supported = {kV1Service, kV1beta1Service};
  for (const std::string& service : services) {
    if (std::find(supported.begin(), supported.end(), service) != supported.end()) return service;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("none of services supported by the plugin (", GoQuoted(services),
                   ") are supported by the kubelet (", GoQuoted(supported), ")"));
}

absl::Status DraKubelet::ValidatePlugin(const std::string& name, const std::string& endpoint,
                                        const std::vector<std::string>& services) {
  absl::StatusOr<std::string> chosen = ValidateSupportedServices(services);
  if (chosen.ok()) return absl::OkStatus();
  if (options_.generation == DraKubeletGeneration::kV1_33) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid versions of plugin ", name, ": ", chosen.status().message()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid supported gRPC versions of DRA driver plugin ", name, " at endpoint ",
                   endpoint, ": ", chosen.status().message()));
}

absl::Status DraKubelet::RegisterPlugin(const std::string& name, const std::string& endpoint,
                                        const std::vector<std::string>& services,
                                        const std::string& socket) {
  const bool v1_33 = options_.generation == DraKubeletGeneration::kV1_33;
  absl::StatusOr<std::string> chosen = ValidateSupportedServices(services);
  if (!chosen.ok()) {
    return absl::InvalidArgumentError(
        v1_33 ? absl::StrCat("version check of plugin ", name, " failed: ",
                             chosen.status().message())
              : absl::StrCat("invalid supported gRPC versions of DRA driver plugin ", name,
                             " at endpoint ", endpoint, ": ", chosen.status().message()));
  }
  auto instance = std::make_shared<Instance>();
  instance->registration = Registration{name, *chosen, endpoint, socket, services, absl::Now()};
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::CancelledError("kubelet stopping");
    for (const auto& old : store_[name]) {
      if (old->registration.endpoint == endpoint) {
        // One plugin instance cannot hijack the endpoint of another instance.
        return absl::AlreadyExistsError(
            absl::StrCat("endpoint ", endpoint, " already registered for ",
                         v1_33 ? "plugin " : "DRA driver plugin ", name));
      }
    }
    instance->channel = Dial(endpoint);
    store_[name].push_back(instance);
    registrations_[name].push_back(instance->registration);
    Instance* raw = instance.get();
    if (!v1_33) {
      // 1.34+: the connection is made at once and watched (monitoredPlugin.HandleConn).
      raw->connection_watcher = std::thread([this, raw] { WatchConnection(raw); });
      if (options_.resource_health_status) {
        raw->health = std::thread([this, raw] { HealthLoop(raw); });
      }
    }
    Changed();
  }
  Event(absl::StrCat("registered ", name, " ", *chosen, " ", endpoint));
  return absl::OkStatus();
}

void DraKubelet::RetireLocked(std::shared_ptr<Instance> instance) {
  instance->Cancel();
  retired_.push_back(std::move(instance));
}

void DraKubelet::DeRegisterPlugin(const std::string& name, const std::string& endpoint) {
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = store_.find(name);
    if (it != store_.end()) {
      auto& list = it->second;
      auto pos = std::find_if(list.begin(), list.end(), [&](const auto& instance) {
        return instance->registration.endpoint == endpoint;
      });
      if (pos != list.end()) {
        found = true;
        RetireLocked(*pos);
        list.erase(pos);
        if (list.empty()) store_.erase(it);
        deregistrations_[name]++;
        Changed();
      }
    }
  }
  Event(found ? absl::StrCat("deregistered ", name, " ", endpoint)
              : absl::StrCat("deregister ", name, " ", endpoint, ": not registered"));
}

void DraKubelet::WatchConnection(Instance* instance) {
  // conn.Connect(), and Connect() again whenever the connection ends (HandleConn ConnEnd).
  while (!instance->Cancelled()) {
    grpc_connectivity_state state = instance->channel->GetState(/*try_to_connect=*/true);
    const bool connected = state == GRPC_CHANNEL_READY;
    {
      absl::MutexLock lock(&mu_);
      if (instance->connected != connected) {
        instance->connected = connected;
        Changed();
      }
    }
    instance->channel->WaitForStateChange(state, In(absl::Milliseconds(100)));
  }
}

void DraKubelet::HealthLoop(Instance* instance) {
  const std::string driver = instance->registration.driver;
  auto stub = v1alpha1::DRAResourceHealth::NewStub(instance->channel);
  while (!instance->Cancelled()) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&instance->mu);
      if (instance->cancelled) break;
      instance->health_context = &context;
    }
    {
      absl::MutexLock lock(&mu_);
      health_streams_opened_[driver]++;
      Changed();
    }
    std::unique_ptr<grpc::ClientReader<v1alpha1::NodeWatchResourcesResponse>> reader =
        stub->NodeWatchResources(&context, v1alpha1::NodeWatchResourcesRequest());
    v1alpha1::NodeWatchResourcesResponse response;
    while (reader->Read(&response)) {
      std::vector<HealthEntry> devices;
      std::vector<std::string> said;
      for (const v1alpha1::DeviceHealth& d : response.devices()) {
        HealthEntry entry{d.device().pool_name(), d.device().device_name(), HealthName(d.health()),
                          d.last_updated_time(), d.health_check_timeout_seconds(), d.message()};
        said.push_back(absl::StrCat(entry.pool, "/", entry.device, "=", entry.health));
        devices.push_back(std::move(entry));
      }
      {
        absl::MutexLock lock(&mu_);
        health_[driver] = std::move(devices);
        Changed();
      }
      Event(absl::StrCat("health ", driver, ": ",
                         said.empty() ? "(no devices)" : absl::StrJoin(said, " ")));
    }
    grpc::Status status = reader->Finish();
    bool cancelled;
    {
      absl::MutexLock lock(&instance->mu);
      instance->health_context = nullptr;
      cancelled = instance->cancelled;
    }
    {
      // HandleWatchResourcesStream's deferred clearDriver.
      absl::MutexLock lock(&mu_);
      health_.erase(driver);
      if (!status.ok() && !cancelled) {
        health_stream_errors_[driver]++;
        last_health_stream_error_[driver] =
            absl::StrCat(GoCodeName(status.error_code()), ": ", status.error_message());
      }
      Changed();
    }
    Event(absl::StrCat("health stream ", driver, " ended: ",
                       status.ok() ? std::string("EOF") : GoError(status)));
    if (instance->SleepUnlessCancelled(options_.health_retry_interval)) break;
  }
}

std::shared_ptr<DraKubelet::Instance> DraKubelet::PluginFor(const std::string& driver,
                                                           std::string* error) {
  absl::MutexLock lock(&mu_);
  if (driver.empty()) {
    *error = "DRA driver name is empty";
    return nullptr;
  }
  auto it = store_.find(driver);
  if (it == store_.end() || it->second.empty()) {
    *error = absl::StrCat("DRA driver ", driver, " is not registered");
    return nullptr;
  }
  const auto& list = it->second;
  if (options_.generation == DraKubeletGeneration::kV1_36) {
    // Newest connected, else newest.
    for (auto instance = list.rbegin(); instance != list.rend(); ++instance) {
      if ((*instance)->connected) return *instance;
    }
  }
  return list.back();
}

// --- calls ---

template <typename Answer, typename V1Request, typename V1Response, typename V1beta1Request,
          typename V1beta1Response>
absl::StatusOr<Answer> DraKubelet::CallWithClaims(absl::string_view method, absl::string_view what,
                                                  const std::string& driver,
                                                  const std::vector<Claim>& claims) {
  if (claims.empty()) return absl::InvalidArgumentError("the kubelet never sends an empty batch");
  std::string error;
  std::shared_ptr<Instance> instance = PluginFor(driver, &error);
  if (instance == nullptr) return absl::UnknownError(absl::StrCat(what, ": ", error));
  Answer answer;
  answer.service = instance->registration.service;
  answer.endpoint = instance->registration.endpoint;
  grpc::ClientContext context;
  context.set_deadline(In(options_.call_timeout));
  // The generated stubs make this same call by the method's path; by path, the v1alpha4 method
  // (v1beta1's messages) needs no stub of its own.
  auto call = [&](const std::string& path, const auto& request, auto* response) {
    grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
    return grpc::internal::BlockingUnaryCall<std::decay_t<decltype(request)>,
                                             std::decay_t<decltype(*response)>,
                                             grpc::protobuf::MessageLite,
                                             grpc::protobuf::MessageLite>(
        instance->channel.get(), rpc, &context, request, response);
  };
  grpc::Status status;
  if (answer.service == kV1Service) {
    V1Request request;
    FillClaims(claims, request.mutable_claims());
    V1Response response;
    status = call(absl::StrCat("/", drav1::DRAPlugin::service_full_name(), "/", method), request,
                  &response);
    if (status.ok()) FromProto(response, &answer);
  } else {
    V1beta1Request request;
    FillClaims(claims, request.mutable_claims());
    V1beta1Response response;
    status = call(absl::StrCat("/",
                               answer.service == kV1beta1Service
                                   ? drav1beta1::DRAPlugin::service_full_name()
                                   : kV1alpha4Node,
                               "/", method),
                  request, &response);
    if (status.ok()) FromProto(response, &answer);
  }
  std::vector<std::string> uids;
  for (const Claim& claim : claims) uids.push_back(claim.uid);
  Event(absl::StrCat(method, " ", driver, " ", answer.service, " [", absl::StrJoin(uids, " "),
                     "]: ", status.ok() ? "ok" : GoError(status)));
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat(what, ": ", method, ": ", GoError(status)));
  }
  return answer;
}

absl::StatusOr<DraKubelet::PrepareAnswer> DraKubelet::CallNodePrepareResources(
    const std::string& driver, const std::vector<Claim>& claims) {
  return CallWithClaims<PrepareAnswer, drav1::NodePrepareResourcesRequest,
                        drav1::NodePrepareResourcesResponse,
                        drav1beta1::NodePrepareResourcesRequest,
                        drav1beta1::NodePrepareResourcesResponse>(
      "NodePrepareResources", "prepare dynamic resources", driver, claims);
}

absl::Status DraKubelet::CheckPrepareAnswer(const std::vector<Claim>& claims,
                                            const PrepareAnswer& answer) {
  // prepareResources: the answer's map in order (Go's is random), then the count.
  for (const auto& [uid, result] : answer.claims) {
    auto asked = std::find_if(claims.begin(), claims.end(),
                              [&](const Claim& claim) { return claim.uid == uid; });
    if (asked == claims.end()) {
      return absl::UnknownError(absl::StrCat(
          "prepare dynamic resources: NodePrepareResources returned result for unknown claim UID ",
          uid));
    }
    if (!result.error.empty()) {
      return absl::UnknownError(
          absl::StrCat("prepare dynamic resources: NodePrepareResources failed for ResourceClaim ",
                       asked->name, ": ", result.error));
    }
  }
  const int64_t unfinished =
      static_cast<int64_t>(claims.size()) - static_cast<int64_t>(answer.claims.size());
  if (unfinished != 0) {
    return absl::UnknownError(absl::StrCat(
        "prepare dynamic resources: NodePrepareResources skipped ", unfinished, " ResourceClaims"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DraKubelet::PrepareAnswer> DraKubelet::Prepare(const std::string& driver,
                                                              const std::vector<Claim>& claims) {
  absl::StatusOr<PrepareAnswer> answer = CallNodePrepareResources(driver, claims);
  if (!answer.ok()) return answer;
  if (absl::Status checked = CheckPrepareAnswer(claims, *answer); !checked.ok()) {
    Event(std::string(checked.message()));
    return checked;
  }
  return answer;
}

absl::StatusOr<DraKubelet::UnprepareAnswer> DraKubelet::CallNodeUnprepareResources(
    const std::string& driver, const std::vector<Claim>& claims) {
  return CallWithClaims<UnprepareAnswer, drav1::NodeUnprepareResourcesRequest,
                        drav1::NodeUnprepareResourcesResponse,
                        drav1beta1::NodeUnprepareResourcesRequest,
                        drav1beta1::NodeUnprepareResourcesResponse>(
      "NodeUnprepareResources", "unprepare dynamic resources", driver, claims);
}

absl::Status DraKubelet::CheckUnprepareAnswer(const std::vector<Claim>& claims,
                                              const UnprepareAnswer& answer) {
  for (const auto& [uid, error] : answer.claims) {
    auto asked = std::find_if(claims.begin(), claims.end(),
                              [&](const Claim& claim) { return claim.uid == uid; });
    if (asked == claims.end()) {
      return absl::UnknownError(absl::StrCat("unprepare dynamic resources: NodeUnprepareResources "
                                             "returned result for unknown claim UID ", uid));
    }
    if (!error.empty()) {
      return absl::UnknownError(absl::StrCat(
          "unprepare dynamic resources: NodeUnprepareResources failed for ResourceClaim ",
          asked->name, ": ", error));
    }
  }
  const int64_t unfinished =
      static_cast<int64_t>(claims.size()) - static_cast<int64_t>(answer.claims.size());
  if (unfinished != 0) {
    return absl::UnknownError(absl::StrCat("unprepare dynamic resources: NodeUnprepareResources "
                                           "skipped ", unfinished, " ResourceClaims"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DraKubelet::UnprepareAnswer> DraKubelet::Unprepare(
    const std::string& driver, const std::vector<Claim>& claims) {
  absl::StatusOr<UnprepareAnswer> answer = CallNodeUnprepareResources(driver, claims);
  if (!answer.ok()) return answer;
  if (absl::Status checked = CheckUnprepareAnswer(claims, *answer); !checked.ok()) {
    Event(std::string(checked.message()));
    return checked;
  }
  return answer;
}

// --- observation ---

absl::StatusOr<DraKubelet::Registration> DraKubelet::WaitForRegistration(const std::string& driver,
                                                                         absl::Duration timeout) {
  std::shared_ptr<Instance> instance;
  WaitFor(
      [&] {
        std::string ignored;
        instance = PluginFor(driver, &ignored);
        return instance != nullptr;
      },
      timeout);
  if (instance == nullptr) {
    std::vector<std::string> errors = registration_errors();
    return absl::DeadlineExceededError(absl::StrCat(
        "DRA driver ", driver, " did not register in ", absl::FormatDuration(timeout),
        errors.empty() ? std::string()
                       : absl::StrCat("; last registration error: ", errors.back())));
  }
  return instance->registration;
}

std::vector<DraKubelet::Registration> DraKubelet::registrations(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = registrations_.find(driver);
  return it == registrations_.end() ? std::vector<Registration>() : it->second;
}

std::vector<std::string> DraKubelet::Drivers() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [driver, list] : store_) out.push_back(driver);
  return out;
}

std::vector<DraKubelet::Registration> DraKubelet::Registered(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  std::vector<Registration> out;
  auto it = store_.find(driver);
  if (it != store_.end()) {
    for (const auto& instance : it->second) out.push_back(instance->registration);
  }
  return out;
}

bool DraKubelet::Deregistered(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  return registrations_.count(driver) > 0 && store_.count(driver) == 0;
}

int DraKubelet::deregistrations(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = deregistrations_.find(driver);
  return it == deregistrations_.end() ? 0 : it->second;
}

std::vector<std::string> DraKubelet::refusals() {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

std::vector<std::string> DraKubelet::registration_errors() {
  absl::MutexLock lock(&mu_);
  return registration_errors_;
}

int DraKubelet::get_info_calls(const std::string& socket) {
  absl::MutexLock lock(&mu_);
  auto it = get_info_calls_.find(socket);
  return it == get_info_calls_.end() ? 0 : it->second;
}

std::vector<DraKubelet::HealthEntry> DraKubelet::Health(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = health_.find(driver);
  return it == health_.end() ? std::vector<HealthEntry>() : it->second;
}

DraKubelet::HealthEntry DraKubelet::HealthAt(const std::string& driver, const std::string& pool,
                                             const std::string& device, absl::Time now) {
  HealthEntry unknown{pool, device, "Unknown", 0, 0, ""};
  for (const HealthEntry& entry : Health(driver)) {
    if (entry.pool != pool || entry.device != device) continue;
    const absl::Duration timeout = entry.health_check_timeout_seconds > 0
                                       ? absl::Seconds(entry.health_check_timeout_seconds)
                                       : absl::Seconds(30);
    if (now - absl::FromUnixSeconds(entry.last_updated) > timeout) return unknown;
    return entry;
  }
  return unknown;
}

bool DraKubelet::WaitForHealth(
    const std::string& driver,
    const std::function<bool(const std::vector<HealthEntry>&)>& predicate,
    absl::Duration timeout) {
  return WaitFor([&] { return predicate(Health(driver)); }, timeout);
}

int DraKubelet::health_streams_opened(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = health_streams_opened_.find(driver);
  return it == health_streams_opened_.end() ? 0 : it->second;
}

int DraKubelet::health_stream_errors(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = health_stream_errors_.find(driver);
  return it == health_stream_errors_.end() ? 0 : it->second;
}

std::string DraKubelet::last_health_stream_error(const std::string& driver) {
  absl::MutexLock lock(&mu_);
  auto it = last_health_stream_error_.find(driver);
  return it == last_health_stream_error_.end() ? std::string() : it->second;
}

std::vector<std::string> DraKubelet::events() {
  absl::MutexLock lock(&mu_);
  return events_;
}

bool DraKubelet::WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  return ::edgeaccel::testing::WaitForChange(mu_, version_, condition, timeout);
}

}  // namespace edgeaccel::testing
