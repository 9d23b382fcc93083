#include "edgeaccel/plugin.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/cdi.h"
#include "edgeaccel/constants.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// An id as it may appear in an error message: escaped and bounded, since it came from outside.
std::string Quoted(absl::string_view id) {
  constexpr size_t kMax = 64;
  std::string out = absl::StrCat("\"", absl::CHexEscape(id.substr(0, kMax)), "\"");
  if (id.size() > kMax) absl::StrAppend(&out, "... (", id.size(), " bytes)");
  return out;
}

// True if something accepts connections on the Unix socket at `path`.
bool SocketIsLive(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return live;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Allocation logic

absl::Status BuildContainerAllocation(const Snapshot& snapshot, const std::string& resource,
                                      const v1beta1::ContainerAllocateRequest& request,
                                      const PluginOptions& options,
                                      v1beta1::ContainerAllocateResponse* response) {
  if (request.devices_ids_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate request for ", resource, " names no device"));
  }
  absl::flat_hash_set<absl::string_view> seen_ids;
  absl::flat_hash_set<absl::string_view> seen_paths;
  absl::flat_hash_set<std::string> seen_cdi;
  std::map<std::string, std::vector<std::string>> env_values;
  for (const std::string& id : request.devices_ids()) {
    if (!seen_ids.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("device id ", Quoted(id),
                                                     " is named twice in one request"));
    }
    const Device* device = snapshot.Find(id);
    if (device == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device id ", Quoted(id), " for ", resource, " (",
                       snapshot.devices.size(), " devices known)"));
    }
    if (device->health != Health::kHealthy) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", Quoted(id), " of ", resource, " is Unhealthy: ", device->unhealthy_reason));
    }
    // Paths come only from what discovery found on the host.
    for (const DeviceNode& node : device->nodes) {
      if (!seen_paths.insert(node.host_path).second) continue;
      v1beta1::DeviceSpec* spec = response->add_devices();
      spec->set_host_path(node.host_path);
      spec->set_container_path(node.container_path);
      spec->set_permissions(node.permissions);
    }
    for (const auto& [key, value] : device->envs) {
      std::vector<std::string>& values = env_values[key];
      if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
    }
    if (options.cdi_devices) {
      std::string name = CdiDeviceName(resource, PhysicalId(*device));
      if (seen_cdi.insert(name).second) response->add_cdi_devices()->set_name(std::move(name));
    }
  }
  for (const auto& [key, values] : env_values) {
    (*response->mutable_envs())[key] = absl::StrJoin(values, ",");
  }
  return absl::OkStatus();
}

std::vector<std::string> PreferredDevices(
    const Snapshot& snapshot, const v1beta1::ContainerPreferredAllocationRequest& request) {
  std::vector<std::string> chosen;
  absl::flat_hash_set<std::string> taken;
  std::vector<int> must_numa;
  for (const std::string& id : request.must_include_deviceids()) {
    if (!taken.insert(id).second) continue;
    chosen.push_back(id);
    const Device* device = snapshot.Find(id);
    if (device != nullptr && device->numa_node.has_value()) must_numa.push_back(*device->numa_node);
  }
  const int size = request.allocation_size();
  if (size <= static_cast<int>(chosen.size())) {
    std::sort(chosen.begin(), chosen.end());
    return chosen;
  }
  size_t need = static_cast<size_t>(size) - chosen.size();

  // Healthy candidates grouped by NUMA node (-1: unknown), sorted by id within a group, each with
  // its physical device (itself, or what it is a replica of).
  struct Candidate {
    std::string id;
    std::string physical;
  };
  std::map<int, std::vector<Candidate>> by_numa;
  absl::flat_hash_map<std::string, int> free_replicas;  // per physical device
  for (const std::string& id : request.available_deviceids()) {
    if (taken.contains(id)) continue;
    const Device* device = snapshot.Find(id);
    if (device == nullptr || device->health != Health::kHealthy) continue;
    by_numa[device->numa_node.value_or(-1)].push_back({id, PhysicalId(*device)});
    free_replicas[PhysicalId(*device)]++;
    taken.insert(id);
  }
  for (auto& [numa, candidates] : by_numa) {
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }

  // Order NUMA nodes: those of the must-include devices first; then nodes that can satisfy the
  // rest alone, smallest first (best fit leaves big groups for big requests); then the others,
  // biggest first. Ties by node number: deterministic.
  std::vector<int> order;
  for (const auto& [numa, candidates] : by_numa) order.push_back(numa);
  auto rank = [&](int numa) {
    const bool is_must = std::find(must_numa.begin(), must_numa.end(), numa) != must_numa.end();
    const size_t count = by_numa[numa].size();
    if (is_must) return std::make_tuple(0, 0L, numa);
    if (count >= need) return std::make_tuple(1, static_cast<long>(count), numa);
    return std::make_tuple(2, -static_cast<long>(count), numa);
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return rank(a) < rank(b); });

  // Within a node, spread over physical devices: least used in this answer first, then the one
  // with most replicas free (least loaded by other pods), then by id.
  absl::flat_hash_map<std::string, int> used;
  for (const std::string& id : chosen) {
    const Device* device = snapshot.Find(id);
    used[device == nullptr ? id : PhysicalId(*device)]++;
  }
  for (int numa : order) {
    std::vector<Candidate>& candidates = by_numa[numa];
    while (need > 0 && !candidates.empty()) {
      auto key = [&](const Candidate& c) {
        return std::make_tuple(used[c.physical], -free_replicas[c.physical],
                               std::cref(c.physical), std::cref(c.id));
      };
      auto best = candidates.begin();
      for (auto it = candidates.begin() + 1; it != candidates.end(); ++it) {
        if (key(*it) < key(*best)) best = it;
      }
      used[best->physical]++;
      chosen.push_back(std::move(best->id));
      candidates.erase(best);
      --need;
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// ---------------------------------------------------------------------------------------------
// ListAndWatch stream

class DevicePluginService::Stream final
    : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  explicit Stream(DevicePluginService* service) : service_(service) {}

  void Begin(const std::shared_ptr<Stream>& self) {
    std::weak_ptr<Stream> weak = self;
    listener_id_ = service_->set_->Subscribe([weak](std::shared_ptr<const Snapshot> snapshot) {
      if (std::shared_ptr<Stream> stream = weak.lock()) stream->Deliver(std::move(snapshot));
    });
    Deliver(service_->set_->Current());
  }

  // A new device list: send it now, or as soon as the write in flight completes.
  void Deliver(std::shared_ptr<const Snapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!latest_ || snapshot->version > latest_->version) latest_ = std::move(snapshot);
      if (writing_ || !NeedsWriteLocked()) return;
      PrepareWriteLocked();
    }
    StartWrite(&response_);
  }

  // Ends the stream with OK (daemon shutdown or server restart).
  void End() { FinishOnce(grpc::Status::OK); }

  void OnWriteDone(bool ok) override {
    bool write_next = false;
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) service_->counters_->list_and_watch_updates.fetch_add(1);
      if (!ok) {
        finish = !finished_ || end_pending_;
        finished_ = true;
        finish_with = grpc::Status(grpc::StatusCode::CANCELLED, "ListAndWatch stream broken");
      } else if (end_pending_) {
        finish = true;
        finish_with = end_status_;
      } else if (!finished_ && NeedsWriteLocked()) {
        PrepareWriteLocked();
        write_next = true;
      }
      if (finish) end_pending_ = false;
    }
    if (write_next) StartWrite(&response_);
    if (finish) Finish(finish_with);
  }

  void OnCancel() override {
    VLOG(1) << service_->set_->resource_name() << ": ListAndWatch stream cancelled by the client";
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }

  void OnDone() override {
    service_->set_->Unsubscribe(listener_id_);
    service_->Forget(this);  // may destroy this object: nothing may follow
  }

 private:
  bool NeedsWriteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return latest_ && (!sent_any_ || latest_->version != sent_version_);
  }

  void PrepareWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    sent_any_ = true;
    sent_version_ = latest_->version;
    response_.Clear();
    for (const Device& device : latest_->devices) {
      v1beta1::Device* out = response_.add_devices();
      out->set_id(device.id);
      out->set_health(std::string(HealthName(device.health)));
      if (device.numa_node.has_value()) out->mutable_topology()->add_nodes()->set_id(*device.numa_node);
    }
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (writing_) {
        // Finish after the write in flight completes (OnWriteDone).
        end_pending_ = true;
        end_status_ = status;
        return;
      }
    }
    Finish(status);
  }

  DevicePluginService* const service_;
  uint64_t listener_id_ = 0;
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  v1beta1::ListAndWatchResponse response_;  // owned by gRPC while a write is in flight
};

// ---------------------------------------------------------------------------------------------
// Service

DevicePluginService::DevicePluginService(DeviceSet* set, PluginCounters* counters,
                                         PluginOptions options)
    : set_(set), counters_(counters), options_(options) {}

DevicePluginService::~DevicePluginService() {
  absl::MutexLock lock(&mu_);
  LOG_IF(DFATAL, !streams_.empty()) << "DevicePluginService destroyed with open streams";
}

void DevicePluginService::EndStreams() {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    for (const auto& [ptr, stream] : streams_) open.push_back(stream);
  }
  for (const auto& stream : open) stream->End();
}

void DevicePluginService::Forget(Stream* stream) {
  std::shared_ptr<Stream> last;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  last = std::move(it->second);
  streams_.erase(it);
}

grpc::ServerUnaryReactor* DevicePluginService::GetDevicePluginOptions(
    grpc::CallbackServerContext* context, const v1beta1::Empty*,
    v1beta1::DevicePluginOptions* response) {
  response->set_pre_start_required(false);
  response->set_get_preferred_allocation_available(true);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* DevicePluginService::ListAndWatch(
    grpc::CallbackServerContext*, const v1beta1::Empty*) {
  auto stream = std::make_shared<Stream>(this);
  bool ended;
  {
    // Every stream is kept alive by this map until its OnDone.
    absl::MutexLock lock(&mu_);
    ended = ended_;
    streams_[stream.get()] = stream;
  }
  counters_->streams_opened.fetch_add(1);
  if (ended) {
    stream->End();  // shutting down: answer at once, with no devices
  } else {
    LOG(INFO) << set_->resource_name() << ": ListAndWatch stream opened";
    stream->Begin(stream);
  }
  return stream.get();
}

grpc::ServerUnaryReactor* DevicePluginService::GetPreferredAllocation(
    grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  for (const auto& container : request->container_requests()) {
    auto* out = response->add_container_responses();
    for (std::string& id : PreferredDevices(*snapshot, container)) out->add_deviceids(std::move(id));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::Allocate(grpc::CallbackServerContext* context,
                                                        const v1beta1::AllocateRequest* request,
                                                        v1beta1::AllocateResponse* response) {
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  absl::Status status;
  if (request->container_requests_size() == 0) {
    status = absl::InvalidArgumentError("Allocate request has no container");
  }
  for (const auto& container : request->container_requests()) {
    status = BuildContainerAllocation(*snapshot, set_->resource_name(), container, options_,
                                      response->add_container_responses());
    if (!status.ok()) break;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok()) {
    counters_->allocations.fetch_add(1);
    VLOG(1) << set_->resource_name() << ": allocated " << request->ShortDebugString();
  } else {
    counters_->allocate_errors.fetch_add(1);
    response->Clear();
    LOG(WARNING) << set_->resource_name() << ": Allocate refused: " << status.message();
  }
  reactor->Finish(ToGrpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::PreStartContainer(
    grpc::CallbackServerContext* context, const v1beta1::PreStartContainerRequest*,
    v1beta1::PreStartContainerResponse*) {
  // Nothing to prepare: Edge TPUs and GPUs need no reset before a container starts. The kubelet
  // only calls this when pre_start_required is set, which we do not set.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// ---------------------------------------------------------------------------------------------
// Server

PluginServer::PluginServer(std::string socket_path, DeviceSet* set, PluginCounters* counters,
                           grpc::Service* extra_service, PluginOptions options)
    : socket_path_(std::move(socket_path)),
      set_(set),
      counters_(counters),
      extra_service_(extra_service),
      options_(options) {}

PluginServer::~PluginServer() { Stop(); }

absl::Status PluginServer::Start() {
  if (server_ != nullptr) return absl::OkStatus();
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", socket_path_, " is longer than ",
                                                   sizeof(sockaddr_un::sun_path) - 1,
                                                   " bytes, the limit for a Unix socket"));
  }
  struct stat st;
  if (lstat(socket_path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot serve on ", socket_path_, ": the path is taken by ",
          S_ISDIR(st.st_mode) ? "a directory" : S_ISREG(st.st_mode) ? "a regular file" : "a non-socket file",
          "; remove it, or point --device-plugin-dir (or --kubelet-root) elsewhere"));
    }
    if (SocketIsLive(socket_path_)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "cannot serve on ", socket_path_,
          ": another process is serving on it (a second edgeaccel-device-plugin?)"));
    }
    // A stale socket from an earlier run: replace it.
    if (unlink(socket_path_.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(
          absl::StrCat("cannot remove stale socket ", socket_path_, ": ", strerror(errno)));
    }
    LOG(INFO) << "replaced stale socket " << socket_path_;
  } else if (errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot stat ", socket_path_, ": ", strerror(errno)));
  }

  service_ = std::make_unique<DevicePluginService>(set_, counters_, options_);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path_), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  if (extra_service_ != nullptr) builder.RegisterService(extra_service_);
  // Keep a kubelet's idle ListAndWatch connection alive without pings from our side.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    service_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_,
                                               " (does the directory exist and is it writable?)"));
  }
  // Only root (the kubelet) may connect: device plugin sockets hand out device access.
  chmod(socket_path_.c_str(), 0600);
  if (stat(socket_path_.c_str(), &st) == 0) inode_ = st.st_ino;
  VLOG(1) << "serving " << set_->resource_name() << " on " << socket_path_;
  return absl::OkStatus();
}

void PluginServer::Stop(absl::Duration grace) {
  if (server_ == nullptr) return;
  service_->EndStreams();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
  server_.reset();
  service_.reset();
  struct stat st;
  if (stat(socket_path_.c_str(), &st) == 0 && st.st_ino == inode_ && S_ISSOCK(st.st_mode)) {
    unlink(socket_path_.c_str());
  }
  inode_ = 0;
}

bool PluginServer::SocketPresent() const {
  if (server_ == nullptr) return false;
  struct stat st;
  return stat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode_;
}

}  // namespace edgeaccel
