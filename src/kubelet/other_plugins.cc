#include "edgeaccel/kubelet/other_plugins.h"

#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory/replicas.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {
namespace {

// More sockets than any node has plugins: a directory full of junk cannot stall us for long.
constexpr size_t kMaxSocketsLooked = 32;

std::vector<std::string> SocketsIn(const std::string& directory, const std::string& skip) {
  std::vector<std::string> sockets;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return sockets;
  while (struct dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || name == skip || name == kKubeletSocketName) continue;
    const std::string path = absl::StrCat(directory, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) sockets.push_back(path);
  }
  closedir(dir);
  std::sort(sockets.begin(), sockets.end());
  if (sockets.size() > kMaxSocketsLooked) sockets.resize(kMaxSocketsLooked);
  return sockets;
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

// The device ids the plugin on `socket` advertises first, or nullopt if it does not answer.
std::optional<std::vector<std::string>> AdvertisedIds(const std::string& socket,
                                                      absl::Duration timeout) {
  auto stub = v1beta1::DevicePlugin::NewStub(DialUnixSocket(socket));
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  const bool answered = reader->Read(&response);
  context.TryCancel();
  reader->Finish();
  if (!answered) return std::nullopt;
  std::vector<std::string> ids;
  for (const v1beta1::Device& device : response.devices()) ids.push_back(device.id());
  return ids;
}

// The resource a plugin-watcher socket says it is, or "" if it does not answer as a device
// plugin.
std::string WatcherResource(const std::string& socket, absl::Duration timeout) {
  auto stub = pluginregistration::Registration::NewStub(DialUnixSocket(socket));
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  pluginregistration::PluginInfo info;
  if (!stub->GetInfo(&context, pluginregistration::InfoRequest(), &info).ok()) return "";
  return info.type() == kPluginTypeDevicePlugin ? info.name() : "";
}

}  // namespace

std::optional<OtherPlugin> FindOtherPlugin(const OtherPluginQuery& query) {
  for (const std::string& socket : SocketsIn(query.plugins_registry_dir, query.own_socket_name)) {
    if (WatcherResource(socket, query.timeout) == query.resource) {
      return OtherPlugin{socket, "plugin-watcher",
                         absl::StrCat("its GetInfo names ", query.resource)};
    }
  }

  const std::vector<std::string> sockets = SocketsIn(query.device_plugin_dir, query.own_socket_name);
  if (sockets.empty()) return std::nullopt;
  // Devices tied to the resource: ours, and the kubelet's.
  absl::flat_hash_set<std::string> ours, kubelets;
  for (const std::string& id : query.own_ids) ours.insert(PhysicalIdOf(id));
  for (const std::string& id : query.kubelet_ids) kubelets.insert(PhysicalIdOf(id));
  for (const std::string& socket : sockets) {
    std::optional<std::vector<std::string>> ids = AdvertisedIds(socket, query.timeout);
    if (!ids.has_value()) {
      VLOG(1) << query.resource << ": " << socket << " did not answer ListAndWatch within "
              << absl::FormatDuration(query.timeout) << "; not counted as serving it";
      continue;
    }
    for (const std::string& id : *ids) {
      const std::string physical = PhysicalIdOf(id);
      if (ours.contains(physical)) {
        return OtherPlugin{socket, "kubelet",
                           absl::StrCat("it advertises ", id, ", a device we found too")};
      }
      if (kubelets.contains(physical)) {
        return OtherPlugin{socket, "kubelet",
                           absl::StrCat("it advertises ", id, ", which the kubelet holds for ",
                                        query.resource)};
      }
    }
  }
  return std::nullopt;
}

class OtherPluginWatch::Reactor final
    : public grpc::ClientReadReactor<v1beta1::ListAndWatchResponse> {
 public:
  Reactor(const std::string& socket, int notify_fd)
      : stub_(v1beta1::DevicePlugin::NewStub(DialUnixSocket(socket))), notify_fd_(notify_fd) {
    stub_->async()->ListAndWatch(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&response_);  // its updates are not ours to act on; keep listening
  }
  void OnDone(const grpc::Status&) override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      if (cancelled_) return;  // we ended it: nothing to report
    }
    uint64_t one = 1;
    (void)!write(notify_fd_, &one, sizeof(one));
  }
  void CancelAndWait() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    context_.TryCancel();
    mu_.Await(absl::Condition(&done_));
  }

 private:
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
  const int notify_fd_;
  grpc::ClientContext context_;
  v1beta1::Empty request_;
  v1beta1::ListAndWatchResponse response_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

OtherPluginWatch::OtherPluginWatch(const std::string& socket, int notify_fd)
    : reactor_(std::make_unique<Reactor>(socket, notify_fd)) {}

OtherPluginWatch::~OtherPluginWatch() { reactor_->CancelAndWait(); }

}  // namespace edgeaccel
