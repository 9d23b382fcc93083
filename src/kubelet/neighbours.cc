#include "edgeaccel/kubelet/neighbours.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/kubelet_checkpoint.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {
namespace {

// More sockets than any node has plugins: a directory full of junk cannot stall us for long.
constexpr size_t kMaxSocketsLooked = 32;

bool IsSocket(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::vector<std::string> SocketsIn(const std::string& directory) {
  std::vector<std::string> sockets;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return sockets;
  while (struct dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || name == kKubeletSocketName) continue;
    const std::string path = absl::StrCat(directory, "/", name);
    if (IsSocket(path)) sockets.push_back(path);
  }
  closedir(dir);
  std::sort(sockets.begin(), sockets.end());
  if (sockets.size() > kMaxSocketsLooked) sockets.resize(kMaxSocketsLooked);
  return sockets;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string WatcherResource(const std::string& socket, absl::Duration timeout) {
  auto stub = pluginregistration::Registration::NewStub(DialUnixSocket(socket));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  pluginregistration::PluginInfo info;
  if (!stub->GetInfo(&context, pluginregistration::InfoRequest(), &info).ok()) return "";
  return info.type() == kPluginTypeDevicePlugin ? info.name() : "";
}

NeighbourView LookAround(const NeighbourQuery& query) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + query.budget;
  NeighbourView view;
  // Each call gets what is left of the budget, at most its own timeout.
  auto timeout = [&]() { return std::min(query.call_timeout, deadline - absl::Now()); };

  for (const std::string& socket : SocketsIn(query.plugins_registry_dir)) {
    if (socket == query.serving_on || socket == query.also_serving_on) continue;
    if (Basename(socket) == query.own_socket_name) {
      if (view.predecessor.empty() && UnixSocketAnswers(socket)) view.predecessor = socket;
      continue;
    }
    if (!view.registry_claim.empty()) continue;
    if (timeout() <= absl::ZeroDuration()) {
      view.out_of_budget = true;
      break;
    }
    if (WatcherResource(socket, timeout()) == query.resource) view.registry_claim = socket;
  }

  for (const std::string& socket : SocketsIn(query.device_plugin_dir)) {
    if (socket == query.serving_on || socket == query.also_serving_on) continue;
    const bool ours = Basename(socket) == query.own_socket_name;
    if (!UnixSocketAnswers(socket)) continue;
    if (ours) {
      if (view.predecessor.empty()) view.predecessor = socket;
    } else {
      ++view.live_foreign_sockets;
      struct stat st;
      const ino_t inode = stat(socket.c_str(), &st) == 0 ? st.st_ino : 0;
      view.live_foreign.push_back(absl::StrCat(socket, "@", inode));
    }
  }

  const NeighbourView* const recent = query.reuse_holdings_of;
  if (recent != nullptr && recent->holdings_read && view.registry_claim.empty() &&
      !view.out_of_budget && view.live_foreign == recent->live_foreign) {
    view.holdings = recent->holdings;
    view.holdings_read = true;
    view.holdings_note = recent->holdings_note;
    view.holdings_reused = true;
    view.took = absl::Now() - start;
    return view;
  }

  // What the kubelet holds: the pod-resources API, else the checkpoint. The checkpoint is read
  // either way for the resources the kubelet knows (pod-resources lists only healthy ones).
  absl::StatusOr<KubeletCheckpoint> checkpoint = ReadKubeletCheckpoint(
      absl::StrCat(query.device_plugin_dir, "/", kKubeletCheckpointName));
  absl::StatusOr<KubeletHoldings> asked = absl::DeadlineExceededError("no time left");
  if (timeout() > absl::ZeroDuration()) {
    asked = AskPodResources(query.pod_resources_socket, timeout());
  } else {
    view.out_of_budget = true;
  }
  if (asked.ok()) {
    view.holdings = *std::move(asked);
    view.holdings_read = true;
  } else {
    view.holdings_note = std::string(asked.status().message());
    if (checkpoint.ok()) {
      view.holdings = HoldingsFromCheckpoint(*checkpoint);
      view.holdings_read = true;
    }
  }
  if (checkpoint.ok() && checkpoint->unreadable_entries > 0) {
    view.checkpoint_problem = "PodDeviceEntries of a shape we do not know";
  } else if (!checkpoint.ok() && !absl::IsNotFound(checkpoint.status())) {
    view.checkpoint_problem = std::string(checkpoint.status().message());
  }
  if (checkpoint.ok()) {
    for (const auto& [resource, ids] : checkpoint->registered_devices) {
      view.holdings.known.insert(resource);
    }
  } else if (!asked.ok()) {
    absl::StrAppend(&view.holdings_note, "; ", checkpoint.status().message());
  }
  view.took = absl::Now() - start;
  return view;
}

}  // namespace edgeaccel
