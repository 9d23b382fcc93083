#include "test_kubelet.h"

#include <dirent.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint_checksum.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"
#include "fixture_host.h"

namespace edgeaccel::testing {
namespace {

constexpr char kVersion[] = "v1beta1";

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::string Basename(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

bool IsExtendedResourceName(const std::string& name) {
  // Native resources have no domain or live under kubernetes.io; "requests." is the quota prefix.
  if (name.find('/') == std::string::npos || absl::StrContains(name, "kubernetes.io/") ||
      absl::StartsWith(name, "requests.")) {
    return false;
  }
  std::pair<std::string, std::string> parts = absl::StrSplit(name, absl::MaxSplits('/', 1));
  const std::string& domain = parts.first;
  const std::string& short_name = parts.second;
  static const std::regex kDns1123Subdomain(
      "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  static const std::regex kQualifiedName("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
  return !domain.empty() && domain.size() <= 253 && std::regex_match(domain, kDns1123Subdomain) &&
         !short_name.empty() && short_name.size() <= 63 &&
         std::regex_match(short_name, kQualifiedName);
}

std::string KubeletProfileName(KubeletProfile profile) {
  switch (profile) {
    case KubeletProfile::kV1_20:
      return "v1.20";
    case KubeletProfile::kV1_25ToV1_36:
      return "v1.25-v1.36";
    case KubeletProfile::kV1_37:
      return "v1.37+";
  }
  return "?";
}

std::string KubeletProfileTestName(KubeletProfile profile) {
  std::string name = KubeletProfileName(profile);
  name.erase(std::remove_if(name.begin(), name.end(), [](char c) { return !isalnum(c); }),
             name.end());
  return name;
}

class TestKubelet::PodResourcesService final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesService(TestKubelet* kubelet) : kubelet_(kubelet) {}
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* response) override {
    absl::MutexLock lock(&kubelet_->mu_);
    kubelet_->AllocatableLocked(response);
    return grpc::Status::OK;
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    absl::MutexLock lock(&kubelet_->mu_);
    kubelet_->ListLocked(response);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    absl::MutexLock lock(&kubelet_->mu_);
    v1::ListPodResourcesResponse all;
    kubelet_->ListLocked(&all);
    for (const v1::PodResources& pod : all.pod_resources()) {
      if (pod.name() == request->pod_name() && pod.namespace_() == request->pod_namespace()) {
        *response->mutable_pod_resources() = pod;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::UNKNOWN,
                        absl::StrCat("pod ", request->pod_name(), " in namespace ",
                                     request->pod_namespace(), " not found"));
  }

 private:
  TestKubelet* kubelet_;
};

class TestKubelet::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(TestKubelet* kubelet) : kubelet_(kubelet) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    return kubelet_->HandleRegister(*request);
  }

 private:
  TestKubelet* kubelet_;
};

TestKubelet::TestKubelet(std::string root, KubeletProfile profile)
    : root_(std::move(root)), profile_(profile) {}

TestKubelet::~TestKubelet() { Stop(); }

std::string TestKubelet::DevicePluginsDir() const { return root_ + "/device-plugins"; }
std::string TestKubelet::PluginsRegistryDir() const { return root_ + "/plugins_registry"; }

void TestKubelet::Start() {
  mkdir(root_.c_str(), 0755);
  mkdir(DevicePluginsDir().c_str(), 0755);
  mkdir(PluginsRegistryDir().c_str(), 0755);
  // CleanupPluginDirectory: 1.25+ removes the sockets, 1.20-1.24 every file but the checkpoint;
  // directories stay in both.
  if (DIR* dir = opendir(DevicePluginsDir().c_str())) {
    while (struct dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name == "." || name == ".." || name == kKubeletCheckpointName) continue;
      const std::string path = DevicePluginsDir() + "/" + name;
      struct stat st;
      if (stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      if (profile_ != KubeletProfile::kV1_20 && !S_ISSOCK(st.st_mode)) continue;
      unlink(path.c_str());
    }
    closedir(dir);
  }
  const std::string checkpoint = absl::StrCat(DevicePluginsDir(), "/", kKubeletCheckpointName);
  if (access(checkpoint.c_str(), F_OK) != 0) {
    FILE* f = fopen(checkpoint.c_str(), "w");
    if (f != nullptr) {
      // An empty kubelet's checkpoint, checksummed as the kubelet does (3467439661).
      const nlohmann::json data = {{"PodDeviceEntries", nullptr},
                                   {"RegisteredDevices", nlohmann::json::object()}};
      const std::string text =
          nlohmann::json{{"Data", data}, {"Checksum", CheckpointChecksum(data)}}.dump();
      fputs(text.c_str(), f);
      fclose(f);
    }
  }
  {
    // readCheckpoint: what the new process knows. Every resource of RegisteredDevices has no
    // device (capacity 0) until its plugin registers again; nothing is written yet.
    absl::MutexLock lock(&mu_);
    for (auto& [resource, state] : resources_) {
      state.devices.clear();
      state.stream_open = false;
      state.ever_registered = false;
    }
    std::ifstream in(checkpoint);
    nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (json.is_object() && json.contains("Data") && json["Data"].is_object() &&
        json["Data"].contains("RegisteredDevices") &&
        json["Data"]["RegisteredDevices"].is_object()) {
      for (const auto& [resource, ids] : json["Data"]["RegisteredDevices"].items()) {
        resources_[resource].ever_registered = true;
      }
    }
  }
  // Kubelets that support the plugin watcher leave this note for device plugins.
  if (FILE* f = fopen((DevicePluginsDir() + "/DEPRECATION").c_str(), "w")) {
    fputs("Dear device plugin authors, use the plugin watcher.\n", f);
    fclose(f);
  }
  {
    absl::MutexLock lock(&mu_);
    running_ = true;
  }
  service_ = std::make_unique<RegistrationService>(this);
  {
    absl::MutexLock lock(&mu_);
    socket_created_ = absl::Now();  // just before bind(): the earliest a plugin can see it
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", DevicePluginsDir(), "/kubelet.sock"),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  CHECK(server_ != nullptr) << "test kubelet cannot listen in " << DevicePluginsDir();

  if (serve_pod_resources_) {
    const std::string dir = root_ + "/pod-resources";
    mkdir(dir.c_str(), 0755);
    unlink((dir + "/kubelet.sock").c_str());
    pod_resources_service_ = std::make_unique<PodResourcesService>(this);
    grpc::ServerBuilder pod_resources;
    pod_resources.AddListeningPort(absl::StrCat("unix:", dir, "/kubelet.sock"),
                                   grpc::InsecureServerCredentials());
    pod_resources.RegisterService(pod_resources_service_.get());
    pod_resources_server_ = pod_resources.BuildAndStart();
    CHECK(pod_resources_server_ != nullptr) << "test kubelet cannot listen in " << dir;
  }

  {
    // A new process: the plugin manager's state starts empty.
    absl::MutexLock lock(&mu_);
    desired_.clear();
    actual_.clear();
    operations_.clear();
  }
  watcher_stop_fd_ = eventfd(0, EFD_CLOEXEC);
  // plugin_watcher.go Start: the watch first, then every socket already there is a Create, both
  // before Start returns; only then does the goroutine that handles events begin. A plugin
  // started after this is seen once, by its create event (a walk still under way could see it a
  // second time, as a new incarnation, and the reconciler would register it again).
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  inotify_add_watch(fd, PluginsRegistryDir().c_str(), IN_CREATE | IN_DELETE);
  if (DIR* dir = opendir(PluginsRegistryDir().c_str())) {
    absl::MutexLock lock(&mu_);
    while (struct dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name[0] == '.') continue;
      const std::string path = PluginsRegistryDir() + "/" + name;
      if (IsSocket(path)) desired_[path] = next_incarnation_++;
    }
    closedir(dir);
  }
  watcher_ = std::thread([this, fd] { WatchPluginsRegistry(fd); });
}

void TestKubelet::ServePodResources(bool serve) { serve_pod_resources_ = serve; }

void TestKubelet::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
  }
  if (watcher_.joinable()) {
    uint64_t one = 1;
    (void)!write(watcher_stop_fd_, &one, sizeof(one));
    watcher_.join();
    close(watcher_stop_fd_);
    watcher_stop_fd_ = -1;
  }
  server_->Shutdown(In(absl::Milliseconds(100)));
  server_->Wait();
  server_.reset();
  service_.reset();
  if (pod_resources_server_ != nullptr) {
    pod_resources_server_->Shutdown(In(absl::Milliseconds(100)));
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
    pod_resources_service_.reset();
    unlink((root_ + "/pod-resources/kubelet.sock").c_str());
  }
  // The process is gone: every connection to every plugin drops.
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [resource, endpoint] : endpoints_) retired_.push_back(std::move(endpoint));
    endpoints_.clear();
    for (auto& endpoint : retired_) {
      if (endpoint->stream_context) endpoint->stream_context->TryCancel();
    }
    endpoints = std::move(retired_);
    retired_.clear();
  }
  for (auto& endpoint : endpoints) {
    if (endpoint->reader.joinable()) endpoint->reader.join();
  }
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads = std::move(connecting_);
    connecting_.clear();
    for (std::thread& thread : operation_threads_) threads.push_back(std::move(thread));
    operation_threads_.clear();
  }
  for (std::thread& thread : threads) thread.join();
}

void TestKubelet::Note(const std::string& entry) {
  absl::MutexLock lock(&mu_);
  call_log_.push_back(entry);
  Changed();
}

grpc::Status TestKubelet::HandleRegister(const v1beta1::RegisterRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    resources_[request.resource_name()].last_register_received = absl::Now();
  }
  Note(absl::StrCat("Register ", request.resource_name()));
  std::string refuse;
  {
    absl::MutexLock lock(&mu_);
    refuse = refuse_with_;
  }
  std::string error;
  if (!refuse.empty()) {
    error = refuse;
  } else if (request.version() != kVersion) {
    error = absl::StrCat("requested device plugin version ", request.version(),
                         " is not supported; supported versions: v1beta1");
  } else if (!IsExtendedResourceName(request.resource_name())) {
    error = absl::StrCat("invalid name of device plugin socket: ", request.resource_name());
  } else if (request.endpoint().empty() || request.endpoint().find('/') != std::string::npos) {
    error = absl::StrCat("invalid endpoint ", request.endpoint());
  } else if (profile_ == KubeletProfile::kV1_20) {
    // Register: go m.addEndpoint(r); return &pluginapi.Empty{}, nil
    absl::MutexLock lock(&mu_);
    connecting_.emplace_back([this, request] {
      absl::Status status = Connect(request.resource_name(),
                                    DevicePluginsDir() + "/" + request.endpoint(), "kubelet",
                                    &request.options());
      if (!status.ok()) {
        absl::MutexLock lock(&mu_);
        errors_.push_back(std::string(status.message()));
        Changed();
      }
    });
  } else {
    absl::Status status =
        Connect(request.resource_name(), DevicePluginsDir() + "/" + request.endpoint(), "kubelet");
    if (!status.ok()) error = std::string(status.message());
  }
  if (!error.empty()) {
    absl::MutexLock lock(&mu_);
    errors_.push_back(error);
    Changed();
    return grpc::Status(grpc::StatusCode::UNKNOWN, error);
  }
  return grpc::Status::OK;
}

absl::Status TestKubelet::Connect(const std::string& resource, const std::string& socket,
                                  const std::string& via,
                                  const v1beta1::DevicePluginOptions* request_options) {
  auto endpoint = std::make_unique<Endpoint>();
  endpoint->resource = resource;
  endpoint->via = via;
  endpoint->socket = socket;
  endpoint->channel = DialUnixSocket(socket);
  endpoint->stub = v1beta1::DevicePlugin::NewStub(endpoint->channel);
  // Kubelets since 1.25 take the options from this call, whichever way the plugin registered;
  // 1.20 dials (blocking) and takes them from the Register request.
  v1beta1::DevicePluginOptions options;
  if (request_options != nullptr) {
    options = *request_options;
    if (!endpoint->channel->WaitForConnected(In(absl::Seconds(10)))) {
      return absl::UnavailableError(absl::StrCat("failed to dial device plugin ", socket));
    }
  } else {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    context.set_wait_for_ready(true);
    grpc::Status status = endpoint->stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options);
    Note(absl::StrCat("GetDevicePluginOptions ", resource));
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("failed to dial device plugin ", socket, ": ", status.error_message()));
    }
  }
  endpoint->stream_context = std::make_unique<grpc::ClientContext>();
  Endpoint* raw = endpoint.get();
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet stopping");
    raw->generation = next_generation_++;
    auto existing = endpoints_.find(resource);
    if (existing != endpoints_.end()) {
      // A new registration replaces the client; the old one stays open, and its stream keeps
      // feeding the device list (registerEndpoint / registerClient).
      retired_.push_back(std::move(existing->second));
    }
    ResourceState& state = resources_[resource];
    state.options = options;
    state.ever_registered = true;
    state.registrations++;
    state.via = via;
    state.generation = raw->generation;
    endpoints_[resource] = std::move(endpoint);
    Changed();
    raw->reader = std::thread([this, raw] { ReadStream(raw); });
  }
  return absl::OkStatus();
}

void TestKubelet::OnListAndWatch(ListAndWatchHook hook) {
  absl::MutexLock lock(&mu_);
  list_and_watch_hook_ = std::move(hook);
}

void TestKubelet::ReadStream(Endpoint* endpoint) {
  Note(absl::StrCat("ListAndWatch ", endpoint->resource));
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader =
      endpoint->stub->ListAndWatch(endpoint->stream_context.get(), v1beta1::Empty());
  {
    absl::MutexLock lock(&mu_);
    ResourceState& state = resources_[endpoint->resource];
    if (state.generation == endpoint->generation) state.stream_open = true;
    Changed();
  }
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    ListAndWatchHook hook;
    {
      absl::MutexLock lock(&mu_);
      hook = list_and_watch_hook_;
    }
    if (hook) {
      std::vector<std::string> ids;
      for (const v1beta1::Device& device : response.devices()) ids.push_back(device.id());
      hook(endpoint->resource, ids);
    }
    absl::MutexLock lock(&mu_);
    ResourceState& state = resources_[endpoint->resource];
    // genericDeviceUpdateCallback is keyed by resource name: whichever stream spoke last.
    state.devices.assign(response.devices().begin(), response.devices().end());
    state.listed_health.clear();
    for (const v1beta1::Device& device : response.devices()) {
      state.listed_health[device.id()] = device.health();
    }
    state.updates++;
    WriteCheckpointLocked();
    Changed();
  }
  reader->Finish();
  absl::MutexLock lock(&mu_);
  if (running_) StreamEndedLocked(endpoint);
  Changed();
}

void TestKubelet::StreamEndedLocked(Endpoint* endpoint) {
  ResourceState& state = resources_[endpoint->resource];
  const bool current = state.generation == endpoint->generation;
  switch (profile_) {
    case KubeletProfile::kV1_20:
      // runEndpoint: markResourceUnhealthy only if the ended endpoint is still the current one.
      if (current) {
        auto held = endpoints_.find(endpoint->resource);
        if (held != endpoints_.end() && held->second.get() == endpoint) state.disconnections++;
        state.stream_open = false;
        for (v1beta1::Device& device : state.devices) device.set_health("Unhealthy");
      }
      break;
    case KubeletProfile::kV1_25ToV1_36:
      // runClient: c = s.getClient(name); disconnectClient(name, c): the current client,
      // whichever stream ended.
      call_log_.push_back(
          absl::StrCat("Disconnect ", endpoint->resource, current ? "" : " (current client)"));
      DisconnectLocked(endpoint->resource);
      break;
    case KubeletProfile::kV1_37:
      // Clients keyed by socket path: only the ended stream's own client goes.
      if (current) DisconnectLocked(endpoint->resource);
      break;
  }
}

void TestKubelet::DisconnectLocked(const std::string& resource) {
  auto it = endpoints_.find(resource);
  if (it == endpoints_.end()) return;
  // Disconnect closes the client's connection (its stream ends) and PluginDisconnected marks
  // every device of the resource unhealthy.
  it->second->stream_context->TryCancel();
  retired_.push_back(std::move(it->second));
  endpoints_.erase(it);
  ResourceState& state = resources_[resource];
  state.disconnections++;
  state.stream_open = false;
  for (v1beta1::Device& device : state.devices) device.set_health("Unhealthy");
  Changed();
}

// operation_generator.go GenerateRegisterPluginFunc: dial (blocking, 10 s), GetInfo (1 s), the
// handler for the type, validate, the actual state of the world updated, RegisterPlugin (the
// device manager connects the endpoint), NotifyRegistrationStatus (5 s). An error anywhere fails
// the operation (backed off by the reconciler).
absl::Status TestKubelet::RegisterFromWatcher(const std::string& socket, uint64_t incarnation) {
  std::shared_ptr<grpc::Channel> channel = DialUnixSocket(socket);
  const absl::Time dial_deadline = absl::Now() + absl::Seconds(10);
  bool connected = false;
  while (!connected && absl::Now() < dial_deadline) {
    connected = channel->WaitForConnected(In(absl::Milliseconds(100)));
    absl::MutexLock lock(&mu_);
    if (!running_) break;
  }
  if (!connected) return absl::UnavailableError(absl::StrCat("cannot dial ", socket));
  auto stub = pluginregistration::Registration::NewStub(channel);
  pluginregistration::PluginInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(1)));
    grpc::Status status = stub->GetInfo(&context, pluginregistration::InfoRequest(), &info);
    Note(absl::StrCat("GetInfo ", Basename(socket)));
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at "
                       "socket ", socket, ", err: ", status.error_message()));
    }
  }
  const std::string endpoint = info.endpoint().empty() ? socket : info.endpoint();
  // The plugin manager hands each type to its handler (reconciler.go: a map from type to
  // handler); DRA drivers and CSI plugins have their own (DraKubelet models the DRA one): here
  // they are registered under no device plugin name.
  if (info.type() == "DRAPlugin" || info.type() == "CSIPlugin") {
    absl::MutexLock lock(&mu_);
    actual_[socket] = {incarnation, "", endpoint};
    return absl::OkStatus();
  }
  std::string error;
  bool version_ok = false;
  for (const std::string& v : info.supported_versions()) version_ok |= v == kVersion;
  std::string refuse;
  {
    absl::MutexLock lock(&mu_);
    refuse = refuse_with_;
  }
  if (!refuse.empty()) {
    error = refuse;
  } else if (info.type() != "DevicePlugin") {
    error = absl::StrCat("unsupported plugin type ", info.type());
  } else if (!version_ok) {
    error = "no supported version (want v1beta1)";
  } else if (!IsExtendedResourceName(info.name())) {
    error = absl::StrCat("invalid resource name ", info.name());
  } else {
    // Added before RegisterPlugin, so a removal during it is handled as a deregistration.
    {
      absl::MutexLock lock(&mu_);
      actual_[socket] = {incarnation, info.name(), endpoint};
    }
    absl::Status status = Connect(info.name(), endpoint, "plugin-watcher");
    if (!status.ok()) error = std::string(status.message());
  }
  pluginregistration::RegistrationStatus notify;
  notify.set_plugin_registered(error.empty());
  notify.set_error(error);
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(5)));
  pluginregistration::RegistrationStatusResponse ignored;
  stub->NotifyRegistrationStatus(&context, notify, &ignored);
  Note(absl::StrCat("NotifyRegistrationStatus ", info.name(), error.empty() ? " ok" : " failed"));
  if (!error.empty()) {
    absl::MutexLock lock(&mu_);
    errors_.push_back(error);  // a failed RegisterPlugin stays in the actual state, as upstream
    Changed();
    return absl::FailedPreconditionError(error);
  }
  return absl::OkStatus();
}

void TestKubelet::Deregister(const std::string& resource, const std::string& endpoint) {
  Note(absl::StrCat("DeRegisterPlugin ", resource));
  absl::MutexLock lock(&mu_);
  // Up to 1.36 DeRegisterPlugin(name[, endpoint]) acts on the name alone: the endpoint holding it
  // now is stopped, whatever its socket (1.20 manager.go: eI.e.stop(); 1.25-1.36 handler.go:
  // s.getClient(pluginName)). 1.37+ checks the endpoint.
  auto it = endpoints_.find(resource);
  if (profile_ == KubeletProfile::kV1_37 && it != endpoints_.end() &&
      it->second->socket != endpoint) {
    return;
  }
  DisconnectLocked(resource);
}

bool TestKubelet::StartOperationLocked(const std::string& socket,
                                       std::function<absl::Status()> operation) {
  PathOperation& op = operations_[socket];
  if (op.pending || absl::Now() < op.retry_after) return false;  // AlreadyExists / backoff
  op.pending = true;
  operation_threads_.emplace_back([this, socket, operation = std::move(operation)] {
    const absl::Status status = operation();
    absl::MutexLock lock(&mu_);
    PathOperation& done = operations_[socket];
    if (status.ok()) {
      operations_.erase(socket);  // goroutinemap: a success forgets the backoff
    } else {
      // exponentialbackoff: 500 ms, doubling, at most 2 m 2 s.
      done.pending = false;
      done.backoff = done.backoff == absl::ZeroDuration()
                         ? absl::Milliseconds(500)
                         : std::min(2 * done.backoff, absl::Seconds(122));
      done.retry_after = absl::Now() + done.backoff;
    }
    Changed();
  });
  return true;
}

void TestKubelet::ReconcileLocked() {
  // reconciler.go reconcile(): unregistrations first. A registered socket whose path left the
  // desired state, or came back as a new socket (another timestamp), is unregistered.
  for (const auto& [socket, registered] : actual_) {
    auto desired = desired_.find(socket);
    if (desired != desired_.end() && desired->second == registered.incarnation) continue;
    const std::string name = registered.name;
    const std::string endpoint = registered.endpoint;
    StartOperationLocked(socket, [this, socket, name, endpoint] {
      // GenerateUnregisterPluginFunc: the actual state first, then the handler.
      {
        absl::MutexLock lock(&mu_);
        actual_.erase(socket);
      }
      if (!name.empty()) Deregister(name, endpoint);
      return absl::OkStatus();
    });
  }
  // Then registrations: every desired socket not registered under its current timestamp. The
  // operations are keyed by socket path, so one still unregistering the path's old socket keeps
  // this one from starting until a later pass.
  for (const auto& [socket, incarnation] : desired_) {
    auto registered = actual_.find(socket);
    if (registered != actual_.end() && registered->second.incarnation == incarnation) continue;
    const uint64_t wanted = incarnation;
    StartOperationLocked(socket, [this, socket, wanted] {
      if (!IsSocket(socket)) return absl::NotFoundError(absl::StrCat(socket, " is gone"));
      return RegisterFromWatcher(socket, wanted);
    });
  }
  ++reconciler_passes_;
  Changed();
}

void TestKubelet::WatchPluginsRegistry(int fd) {
  // reconciler.go Run: wait.Until(reconcile, loopSleepDuration): a pass at once, then one every
  // period.
  absl::Time next_pass = absl::Now();
  while (true) {
    if (absl::Now() >= next_pass) {
      absl::MutexLock lock(&mu_);
      ReconcileLocked();
      next_pass = absl::Now() + reconcile_period_;
    }
    struct pollfd fds[2] = {{fd, POLLIN, 0}, {watcher_stop_fd_, POLLIN, 0}};
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
        if (event->len == 0 || event->name[0] == '.') continue;
        const std::string path = PluginsRegistryDir() + "/" + event->name;
        // plugin_watcher.go: a created socket is AddOrUpdatePlugin (a new timestamp), a removed
        // path RemovePlugin, both at once; the reconciler acts on them on its next pass.
        absl::MutexLock lock(&mu_);
        if ((event->mask & IN_CREATE) && IsSocket(path)) {
          desired_[path] = next_incarnation_++;
        } else if (event->mask & IN_DELETE) {
          desired_.erase(path);
        }
      }
    }
  }
  close(fd);
}

int TestKubelet::Capacity(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end() || !it->second.ever_registered) return -1;
  return static_cast<int>(it->second.devices.size());
}

int TestKubelet::Allocatable(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end() || !it->second.ever_registered) return -1;
  int healthy = 0;
  for (const auto& device : it->second.devices) healthy += device.health() == "Healthy";
  return healthy;
}

std::vector<v1beta1::Device> TestKubelet::Devices(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].devices;
}

int TestKubelet::Registrations(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].registrations;
}

std::string TestKubelet::RegisteredVia(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].via;
}

int TestKubelet::Updates(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].updates;
}

bool TestKubelet::StreamOpen(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].stream_open;
}

bool TestKubelet::HasEndpoint(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return endpoints_.count(resource) > 0;
}

absl::Time TestKubelet::LastRegisterReceived(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].last_register_received;
}

absl::Time TestKubelet::KubeletSocketCreated() {
  absl::MutexLock lock(&mu_);
  return socket_created_;
}

std::vector<std::string> TestKubelet::CallLog() {
  absl::MutexLock lock(&mu_);
  return call_log_;
}

std::vector<std::string> TestKubelet::Errors() {
  absl::MutexLock lock(&mu_);
  return errors_;
}

void TestKubelet::RefuseRegistrations(const std::string& error) {
  absl::MutexLock lock(&mu_);
  refuse_with_ = error;
}

bool TestKubelet::WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  return ::edgeaccel::testing::WaitForChange(mu_, version_, condition, timeout);
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> TestKubelet::StubFor(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = endpoints_.find(resource);
  if (it == endpoints_.end()) return nullptr;
  return v1beta1::DevicePlugin::NewStub(it->second->channel);
}

absl::StatusOr<v1beta1::AllocateResponse> TestKubelet::Allocate(
    const std::string& resource, const std::vector<std::string>& ids) {
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return absl::FailedPreconditionError("resource not registered");
  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (const std::string& id : ids) container->add_devices_ids(id);
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(5)));
  v1beta1::AllocateResponse response;
  grpc::Status status = stub->Allocate(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<std::string> TestKubelet::Admit(const std::string& resource, int count) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    // devicesToAllocate's checks, in its order.
    auto it = resources_.find(resource);
    const bool registered = it != resources_.end() && it->second.ever_registered;
    std::string error;
    int healthy = 0;
    if (registered) {
      std::set<std::string> in_use;
      for (const auto& [uid, cached] : containers_) {
        if (cached.resource == resource) in_use.insert(cached.ids.begin(), cached.ids.end());
      }
      for (const v1beta1::Device& device : it->second.devices) {
        if (device.health() != "Healthy") continue;
        ++healthy;
        if (!in_use.count(device.id()) && static_cast<int>(ids.size()) < count) {
          ids.push_back(device.id());
        }
      }
    }
    if (!registered) {
      error = absl::StrCat("cannot allocate unregistered device ", resource);
    } else if (healthy == 0 && profile_ != KubeletProfile::kV1_20) {
      error = absl::StrCat("no healthy devices present; cannot allocate unhealthy devices ",
                           resource);
    } else if (static_cast<int>(ids.size()) < count) {
      error = absl::StrCat("requested number of devices unavailable for ", resource,
                           ". Requested: ", count, ", Available: ", ids.size());
    } else if (endpoints_.count(resource) == 0) {
      error = absl::StrCat("endpoint not found in cache for a registered resource: ", resource);
    }
    if (!error.empty()) {
      errors_.push_back(error);
      Changed();
      return absl::FailedPreconditionError(
          absl::StrCat("UnexpectedAdmissionError: Allocate failed due to ", error));
    }
  }
  return AdmitPod(resource, ids);
}

void TestKubelet::AllocatableLocked(v1::AllocatableResourcesResponse* response) {
  // GetAllocatableDevices: allDevices filtered by healthyDevices, one ContainerDevices each.
  for (const auto& [resource, state] : resources_) {
    for (const v1beta1::Device& device : state.devices) {
      if (device.health() != "Healthy") continue;
      v1::ContainerDevices* out = response->add_devices();
      out->set_resource_name(resource);
      out->add_device_ids(device.id());
      for (const v1beta1::NUMANode& node : device.topology().nodes()) {
        out->mutable_topology()->add_nodes()->set_id(node.id());
      }
    }
  }
}

void TestKubelet::ListLocked(v1::ListPodResourcesResponse* response) {
  for (const auto& [uid, cached] : containers_) {
    v1::PodResources* pod = response->add_pod_resources();
    pod->set_name(uid);
    pod->set_namespace_("default");
    v1::ContainerResources* container = pod->add_containers();
    container->set_name("main");
    v1::ContainerDevices* devices = container->add_devices();
    devices->set_resource_name(cached.resource);
    for (const std::string& id : cached.ids) devices->add_device_ids(id);
  }
  for (const DraPod& dra : dra_pods_) {
    v1::PodResources* pod = response->add_pod_resources();
    pod->set_name(dra.pod);
    pod->set_namespace_(dra.namespace_name);
    v1::ContainerResources* container = pod->add_containers();
    container->set_name("main");
    v1::DynamicResource* claim = container->add_dynamic_resources();
    claim->set_claim_name(dra.claim);
    claim->set_claim_namespace(dra.namespace_name);
    v1::ClaimResource* resource = claim->add_claim_resources();
    resource->set_driver_name(dra.driver);
    resource->set_pool_name(dra.pool);
    resource->set_device_name(dra.device);
  }
}

void TestKubelet::AddDraPod(const std::string& namespace_name, const std::string& pod,
                            const std::string& claim, const std::string& driver,
                            const std::string& pool, const std::string& device) {
  absl::MutexLock lock(&mu_);
  dra_pods_.push_back({namespace_name, pod, claim, driver, pool, device});
  Changed();
}

absl::StatusOr<std::string> TestKubelet::AdmitPod(const std::string& resource,
                                                  const std::vector<std::string>& ids) {
  absl::StatusOr<v1beta1::AllocateResponse> response = Allocate(resource, ids);
  if (!response.ok()) return response.status();
  // The kubelet keeps the answer for the container's whole life, on disk too.
  absl::MutexLock lock(&mu_);
  const std::string pod_uid = absl::StrCat("pod-", next_pod_++);
  CachedContainer& cached = containers_[pod_uid];
  cached.resource = resource;
  cached.ids = ids;
  if (response->container_responses_size() > 0) {
    cached.response = response->container_responses(0);
  }
  WriteCheckpointLocked();
  return pod_uid;
}

std::vector<std::string> TestKubelet::AllocatedResourcesStatus(const std::string& pod_uid) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> status;
  auto pod = containers_.find(pod_uid);
  if (pod == containers_.end()) return status;
  const std::map<std::string, std::string>& listed = resources_[pod->second.resource].listed_health;
  for (const std::string& id : pod->second.ids) {
    auto health = listed.find(id);
    const bool healthy = health == listed.end() || health->second == "Healthy";
    status.push_back(absl::StrCat(id, "=", healthy ? "Healthy" : "Unhealthy"));
  }
  return status;
}

void TestKubelet::DeletePod(const std::string& pod_uid) {
  absl::MutexLock lock(&mu_);
  containers_.erase(pod_uid);
  WriteCheckpointLocked();
}

absl::Status TestKubelet::StartDraExtendedResourceContainer(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end() || !it->second.ever_registered) return absl::OkStatus();
  if (it->second.options.pre_start_required()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateContainerConfigError: no devices found allocated in local cache for pod dra-pod, "
        "container main, resource ", resource));
  }
  return absl::OkStatus();
}

absl::Status TestKubelet::StartContainer(const std::string& pod_uid) {
  CachedContainer cached;
  bool pre_start;
  std::string host_root;
  {
    absl::MutexLock lock(&mu_);
    auto it = containers_.find(pod_uid);
    if (it == containers_.end()) return absl::NotFoundError("no such pod: " + pod_uid);
    cached = it->second;
    pre_start = resources_[cached.resource].options.pre_start_required();
    host_root = host_root_;
  }
  if (pre_start) {
    absl::Status status = PreStartContainer(cached.resource, cached.ids);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("PreStartContainer for ", cached.resource, ": ",
                                       status.message()));
    }
  }
  // The runtime (containerd's DeviceFromPath) lstats each host path; anything but a device node
  // fails the container.
  for (const v1beta1::DeviceSpec& spec : cached.response.devices()) {
    struct stat st;
    const std::string path = (host_root == "/" ? "" : host_root) + spec.host_path();
    if (lstat(path.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("error gathering device information while adding custom device \"",
                       spec.host_path(), "\": ", strerror(errno)));
    }
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("error gathering device information while adding custom device \"",
                       spec.host_path(), "\": not a device node"));
    }
  }
  Note(absl::StrCat("StartContainer ", pod_uid));
  return absl::OkStatus();
}

void TestKubelet::SetHostRoot(const std::string& root) {
  absl::MutexLock lock(&mu_);
  host_root_ = root;
}

void TestKubelet::SetReconcilePeriod(absl::Duration period) {
  absl::MutexLock lock(&mu_);
  reconcile_period_ = period;
}

uint64_t TestKubelet::ReconcilerPasses() {
  absl::MutexLock lock(&mu_);
  return reconciler_passes_;
}

int TestKubelet::Disconnections(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  return resources_[resource].disconnections;
}

void TestKubelet::WriteCheckpointLocked() {
  nlohmann::json registered = nlohmann::json::object();
  for (const auto& [resource, state] : resources_) {
    if (!state.ever_registered) continue;
    nlohmann::json healthy = nlohmann::json::array();
    for (const v1beta1::Device& device : state.devices) {
      if (device.health() == "Healthy") healthy.push_back(device.id());
    }
    registered[resource] = healthy;
  }
  nlohmann::json entries = containers_.empty() ? nlohmann::json() : nlohmann::json::array();
  for (const auto& [pod_uid, cached] : containers_) {
    // Ids per NUMA node of the device ("-1": no topology), as kubelets since 1.20 write them.
    nlohmann::json per_numa = nlohmann::json::object();
    for (const std::string& id : cached.ids) {
      std::string numa = "-1";
      for (const v1beta1::Device& device : resources_[cached.resource].devices) {
        if (device.id() == id && device.topology().nodes_size() > 0) {
          numa = std::to_string(device.topology().nodes(0).id());
        }
      }
      per_numa[numa].push_back(id);
    }
    entries.push_back({{"PodUID", pod_uid},
                       {"ContainerName", "main"},
                       {"ResourceName", cached.resource},
                       {"DeviceIDs", per_numa},
                       {"AllocResp", absl::Base64Escape(cached.response.SerializeAsString())}});
  }
  const nlohmann::json data = {{"PodDeviceEntries", entries}, {"RegisteredDevices", registered}};
  // Over exactly what is written, as the kubelet's MarshalCheckpoint does.
  nlohmann::json checkpoint = {{"Data", data}, {"Checksum", CheckpointChecksum(data)}};
  const std::string path = absl::StrCat(DevicePluginsDir(), "/", kKubeletCheckpointName);
  const std::string temp = path + ".tmp";
  if (FILE* f = fopen(temp.c_str(), "w")) {
    const std::string text = checkpoint.dump();
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    rename(temp.c_str(), path.c_str());
  }
}

absl::StatusOr<std::vector<std::string>> TestKubelet::GetPreferredAllocation(
    const std::string& resource, const std::vector<std::string>& available,
    const std::vector<std::string>& must_include, int size) {
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return absl::FailedPreconditionError("resource not registered");
  v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  for (const std::string& id : available) container->add_available_deviceids(id);
  for (const std::string& id : must_include) container->add_must_include_deviceids(id);
  container->set_allocation_size(size);
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(5)));
  v1beta1::PreferredAllocationResponse response;
  grpc::Status status = stub->GetPreferredAllocation(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  if (response.container_responses_size() != 1) {
    return absl::InternalError("expected one container response");
  }
  const auto& ids = response.container_responses(0).deviceids();
  return std::vector<std::string>(ids.begin(), ids.end());
}

absl::Status TestKubelet::PreStartContainer(const std::string& resource,
                                            const std::vector<std::string>& ids) {
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub = StubFor(resource);
  if (stub == nullptr) return absl::FailedPreconditionError("resource not registered");
  v1beta1::PreStartContainerRequest request;
  for (const std::string& id : ids) request.add_devices_ids(id);
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  v1beta1::PreStartContainerResponse response;
  return FromGrpc(stub->PreStartContainer(&context, request, &response));
}

ResourceRegistrar::Options RegistrarOptionsFor(const TestKubelet& kubelet, RegistrationMode mode) {
  ResourceRegistrar::Options options;
  options.kubelet_root = kubelet.root();
  options.device_plugin_dir = kubelet.DevicePluginsDir();
  options.mode = mode;
  options.max_backoff = absl::Milliseconds(400);
  return options;
}

}  // namespace edgeaccel::testing
