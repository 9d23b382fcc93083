// DirectoryWatcher: inotify on a set of directories that may not exist yet.
//
// A missing directory (the apex driver not loaded, the kubelet not installed yet) is covered by
// watching its nearest existing ancestor; when that ancestor changes, the caller re-arms and the
// real directory is watched as soon as it exists. Owns its inotify fd (RAII).
#ifndef EDGEACCEL_HOST_DIRECTORY_WATCHER_H_
#define EDGEACCEL_HOST_DIRECTORY_WATCHER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace edgeaccel {

class DirectoryWatcher {
 public:
  struct Event {
    size_t directory;  // index into the list given to Arm()
    std::string name;  // entry name ("" for events on the directory itself)
    uint32_t mask;     // IN_CREATE, IN_DELETE, ...
  };

  DirectoryWatcher();
  ~DirectoryWatcher();
  DirectoryWatcher(const DirectoryWatcher&) = delete;
  DirectoryWatcher& operator=(const DirectoryWatcher&) = delete;

  bool ok() const { return fd_ >= 0; }
  // Tries again to get an inotify instance if the constructor could not (fs.inotify.
  // max_user_instances or the fd limit reached). True when there is one.
  bool Open();
  int fd() const { return fd_; }  // readable when events are pending (for poll/epoll)

  // Watches `directories` (paths as this process opens them), replacing earlier watches.
  // Cheap and idempotent: call it again whenever Drain says so.
  void Arm(const std::vector<std::string>& directories);

  // True if directories[i] itself is watched (it exists), false if an ancestor stands in.
  bool Watching(size_t i) const;

  // False when some directory could be watched neither directly nor through an ancestor
  // (inotify watches used up, permission denied): the caller must not rely on events alone.
  bool complete() const { return fd_ >= 0 && complete_; }

  // Reads every pending event without blocking. Sets *rearm when an ancestor changed, a watched
  // directory went away, or events were lost (the caller should re-arm and rescan).
  std::vector<Event> Drain(bool* rearm);

 private:
  struct Watch {
    std::vector<size_t> directories;  // directories this descriptor watches directly
    bool ancestor = false;            // stands in for at least one missing directory
  };
  int fd_;
  std::vector<std::string> directories_;
  std::vector<bool> direct_;
  bool complete_ = true;
  absl::flat_hash_map<int, Watch> watches_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_DIRECTORY_WATCHER_H_
