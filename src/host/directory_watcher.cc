#include "edgeaccel/host/directory_watcher.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "glog/logging.h"

namespace edgeaccel {
namespace {

// IN_DONT_FOLLOW: the paths given are already resolved inside --host-root; a symlink swapped in
// since must not lead the watch out of it.
constexpr uint32_t kDirectoryEvents = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                                      IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR |
                                      IN_DONT_FOLLOW;
// An ancestor matters only when something is created (or moved) into it, or it goes away.
constexpr uint32_t kAncestorEvents =
    IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == 0 || slash == std::string::npos) return "/";
  return path.substr(0, slash);
}

}  // namespace

DirectoryWatcher::DirectoryWatcher() : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (fd_ < 0) LOG(ERROR) << "inotify_init1 failed: " << strerror(errno);
}

bool DirectoryWatcher::Open() {
  if (fd_ < 0) fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  return fd_ >= 0;
}

DirectoryWatcher::~DirectoryWatcher() {
  if (fd_ >= 0) close(fd_);
}

void DirectoryWatcher::Arm(const std::vector<std::string>& directories) {
  if (fd_ < 0) return;
  directories_ = directories;
  direct_.assign(directories.size(), false);
  absl::flat_hash_map<int, Watch> fresh;
  complete_ = true;
  for (size_t i = 0; i < directories.size(); ++i) {
    // A directory created between our failed watch on it and the watch on its parent would go
    // unseen; so when a stand-in ancestor is watched, check the child again (a few times).
    int wd = -1;
    bool ancestor = false;
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::string dir = directories[i];
      std::string child;
      ancestor = false;
      while (true) {
        wd = inotify_add_watch(fd_, dir.c_str(),
                               (ancestor ? kAncestorEvents : kDirectoryEvents) | IN_MASK_ADD);
        if (wd >= 0 || dir == "/") break;
        if (errno != ENOENT && errno != ENOTDIR) {
          LOG_EVERY_N(WARNING, 100) << "cannot watch " << dir << ": " << strerror(errno)
                                    << " (is fs.inotify.max_user_watches exhausted?)";
          break;
        }
        child = dir;
        dir = Parent(dir);
        ancestor = true;
      }
      if (wd < 0 || !ancestor || access(child.c_str(), F_OK) != 0) break;
    }
    if (wd < 0) {
      complete_ = false;
      continue;
    }
    Watch& watch = fresh[wd];
    if (ancestor) {
      watch.ancestor = true;
    } else {
      watch.directories.push_back(i);
      direct_[i] = true;
    }
  }
  for (const auto& [wd, watch] : watches_) {
    if (!fresh.contains(wd)) inotify_rm_watch(fd_, wd);
  }
  watches_ = std::move(fresh);
}

bool DirectoryWatcher::Watching(size_t i) const { return i < direct_.size() && direct_[i]; }

std::vector<DirectoryWatcher::Event> DirectoryWatcher::Drain(bool* rearm) {
  std::vector<Event> out;
  if (fd_ < 0) return out;
  alignas(struct inotify_event) char buffer[16 * 1024];
  while (true) {
    ssize_t len = read(fd_, buffer, sizeof(buffer));
    if (len < 0 && errno == EINTR) continue;
    if (len <= 0) break;  // EAGAIN: drained
    for (char* p = buffer; p < buffer + len;) {
      auto* event = reinterpret_cast<struct inotify_event*>(p);
      p += sizeof(struct inotify_event) + event->len;
      if (event->mask & IN_Q_OVERFLOW) {
        *rearm = true;
        continue;
      }
      auto it = watches_.find(event->wd);
      if (it == watches_.end()) continue;
      const Watch& watch = it->second;
      if (event->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
        *rearm = true;
        continue;
      }
      if (watch.ancestor) *rearm = true;
      const std::string name = event->len > 0 ? std::string(event->name) : std::string();
      for (size_t dir : watch.directories) out.push_back({dir, name, event->mask});
    }
  }
  return out;
}

}  // namespace edgeaccel
