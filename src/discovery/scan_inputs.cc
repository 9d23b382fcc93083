#include "edgeaccel/discovery/scan_inputs.h"

#include <sys/epoll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <optional>
#include <utility>

namespace edgeaccel {

ScanInputs::~ScanInputs() { CloseInotify(); }

void ScanInputs::CloseInotify() const {
  // Closing it takes it out of wake_epoll_ too: nothing else holds it (O_CLOEXEC, never dup'd).
  if (inotify_ >= 0) close(inotify_);
  inotify_ = -1;
  wake_added_ = false;
  wake_armed_ = false;
  events_ready_ = false;
}

void ScanInputs::WakeThrough(int epoll_fd, uint64_t token) {
  if (wake_added_ && wake_epoll_ >= 0) epoll_ctl(wake_epoll_, EPOLL_CTL_DEL, inotify_, nullptr);
  wake_added_ = false;
  wake_armed_ = false;
  wake_epoll_ = epoll_fd;
  wake_token_ = token;
  ArmWake();
}

void ScanInputs::ArmWake() const {
  wake_armed_ = false;
  if (wake_epoll_ < 0 || inotify_ < 0) return;
  struct epoll_event event = {};
  event.events = EPOLLIN | EPOLLONESHOT;
  event.data.u64 = wake_token_;
  // Either reports an event already queued at once: none is missed between the read and this.
  if (epoll_ctl(wake_epoll_, wake_added_ ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, inotify_, &event) != 0) {
    return;  // not armed: the queue is read on every call
  }
  wake_added_ = true;
  wake_armed_ = true;
  events_ready_ = false;
}

void ScanInputs::Clear() {
  reads_.clear();  // and the files they kept open
  grouped_ = 0;
  started_ = true;
  settings_read_at_ = std::chrono::steady_clock::now();  // the scan reads them
  CloseInotify();  // and its watches, and events not read
  watched_ = false;
  announced_.clear();
  verified_.clear();
  kept_directories_.clear();
}

ScanInputs::Read& ScanInputs::Record(Kind kind, absl::string_view host_path, absl::Status status) {
  Read& read = reads_.emplace_back();
  read.kind = kind;
  read.path = std::string(host_path);
  read.status = std::move(status);
  read.absent = Host::IsAbsence(read.status);
  return read;
}

absl::StatusOr<std::string> ScanInputs::ReadFile(absl::string_view host_path, size_t max_bytes,
                                                 Reread reread) {
  absl::StatusOr<std::string> content = host_->ReadFile(host_path, max_bytes);
  Read& read = Record(Kind::kRead, host_path, content.status());
  read.max_bytes = max_bytes;
  read.reread = reread;
  if (content.ok()) read.text = *content;
  return content;
}

absl::StatusOr<std::string> ScanInputs::ReadPart(absl::string_view host_path, Part part) {
  absl::StatusOr<std::string> content = host_->ReadFile(host_path);
  if (content.ok()) *content = part(*content);
  Read& read = Record(Kind::kRead, host_path, content.status());
  read.max_bytes = 64 * 1024;
  read.part = part;
  if (content.ok()) read.text = *content;
  return content;
}

absl::StatusOr<std::string> ScanInputs::ReadAttribute(absl::string_view host_path, Reread reread) {
  return Host::AttributeOf(ReadFile(host_path, 64 * 1024, reread));
}

absl::StatusOr<int64_t> ScanInputs::ReadInteger(absl::string_view host_path, Reread reread) {
  return Host::IntegerOf(host_path, ReadFile(host_path, 64 * 1024, reread));
}

absl::StatusOr<std::vector<std::string>> ScanInputs::ListDirectory(absl::string_view host_path) {
  absl::StatusOr<std::vector<std::string>> names = host_->ListDirectory(host_path);
  Read& read = Record(Kind::kList, host_path, names.status());
  if (names.ok()) read.names = *names;
  return names;
}

absl::StatusOr<FileInfo> ScanInputs::Stat(absl::string_view host_path) {
  absl::StatusOr<FileInfo> info = host_->Stat(host_path);
  Read& read = Record(Kind::kStat, host_path, info.status());
  if (info.ok()) read.info = *info;
  return info;
}

absl::StatusOr<FileInfo> ScanInputs::Lstat(absl::string_view host_path) {
  absl::StatusOr<FileInfo> info = host_->Lstat(host_path);
  Read& read = Record(Kind::kLstat, host_path, info.status());
  if (info.ok()) read.info = *info;
  return info;
}

bool ScanInputs::Exists(absl::string_view host_path) {
  const bool exists = host_->Exists(host_path);
  Read& read = Record(Kind::kExists, host_path, absl::OkStatus());
  read.exists = exists;
  read.absent = !exists;
  return exists;
}

std::string ScanInputs::ResolveHostPath(absl::string_view host_path) {
  std::string resolved = host_->ResolveHostPath(host_path);
  Record(Kind::kResolve, host_path, absl::OkStatus()).text = resolved;
  return resolved;
}

bool ScanInputs::Settled(const Read& read) {
  switch (read.reread) {
    case Reread::kEveryProbe:
    case Reread::kSetting:
      return false;
    case Reread::kUntilRead:
      return read.status.ok();
    case Reread::kFixedAtBoot:
      return true;
  }
  return false;
}

namespace {

// The directory a path's last step is in ("/" for "/etc"), and that step; false where the path has
// no plain last step ("/", "x/..").
bool SplitPath(const std::string& path, std::string* parent, absl::string_view* name) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return false;
  *name = absl::string_view(path).substr(slash + 1);
  if (name->empty() || *name == "." || *name == "..") return false;
  *parent = slash == 0 ? "/" : path.substr(0, slash);
  return true;
}

}  // namespace

void ScanInputs::Group() const {
  if (grouped_ == reads_.size() && grouped_ != 0) return;
  std::map<std::string, int> entries_in;
  std::vector<std::string> parents(reads_.size());
  std::vector<size_t> names(reads_.size(), 0);
  for (size_t i = 0; i < reads_.size(); ++i) {
    const Read& read = reads_[i];
    if (read.kind == Kind::kList || read.kind == Kind::kResolve) continue;
    absl::string_view name;
    if (!SplitPath(read.path, &parents[i], &name)) {
      parents[i].clear();
      continue;
    }
    names[i] = read.path.size() - name.size();
    // A value read once is not looked at again, and a missing path is looked at from the root:
    // neither makes its directory worth resolving.
    if (!Settled(read) && !read.absent) ++entries_in[parents[i]];
  }
  std::map<std::string, int> index;
  directories_.clear();
  directory_of_.assign(reads_.size(), -1);
  name_at_ = std::move(names);
  // A listed directory is one: it may be kept from one call to the next (Unchanged()).
  for (const Read& read : reads_) {
    if (read.kind != Kind::kList || read.absent) continue;
    auto [it, added] = index.emplace(read.path, static_cast<int>(directories_.size()));
    if (added) directories_.push_back(read.path);
  }
  for (size_t i = 0; i < reads_.size(); ++i) {
    // A file is read through its directory even alone there: from the second read on, a kernel
    // attribute is read through the descriptor kept, and the directory is not resolved at all.
    if (parents[i].empty() || (entries_in[parents[i]] < 2 && reads_[i].kind != Kind::kRead &&
                               index.count(parents[i]) == 0)) {
      continue;
    }
    auto [it, added] = index.emplace(parents[i], static_cast<int>(directories_.size()));
    if (added) directories_.push_back(parents[i]);
    directory_of_[i] = it->second;
  }
  listed_.assign(directories_.size(), false);
  kept_directories_.clear();
  kept_directories_.resize(directories_.size());
  for (size_t i = 0; i < reads_.size(); ++i) {
    if (reads_[i].kind != Kind::kList) continue;
    auto it = index.find(reads_[i].path);
    if (it == index.end()) continue;
    directory_of_[i] = it->second;
    listed_[it->second] = true;
  }
  grouped_ = reads_.size();
}

void ScanInputs::Watch() const {
  watched_ = true;
  announced_.assign(reads_.size(), false);
  verified_.assign(reads_.size(), false);
  identified_.assign(reads_.size(), false);
  held_.assign(reads_.size(), false);
  directory_identified_.assign(directories_.size(), false);
  // Kept from before these watches: what they would have announced may already have happened.
  for (std::unique_ptr<HostDirectory>& kept : kept_directories_) kept.reset();
  std::optional<HostWatches> watches;
  // The inotify instance and the watches on it, made when first needed; false where no instance
  // is left: everything is read again.
  auto ready = [&] {
    if (inotify_ < 0) inotify_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_ < 0) return false;
    if (!watches.has_value()) watches.emplace(host_, inotify_);
    return true;
  };
  for (size_t i = 0; i < reads_.size(); ++i) {
    const Read& read = reads_[i];
    if (Settled(read)) continue;
    if (!ready()) return;
    // A file's content matters where it is read, or where a regular file's size and times are
    // compared. Not a device node's: writes to /dev/null would be events.
    const bool content =
        read.kind == Kind::kRead ||
        ((read.kind == Kind::kStat || read.kind == Kind::kLstat) && read.status.ok() &&
         read.info.type == FileInfo::Type::kRegular);
    announced_[i] = watches->Watch(read.path, read.kind != Kind::kLstat, content);
    // A value whose content changes unannounced is read again on every call, but where it can
    // be no other file while no event comes, through the descriptor kept, as a kernel
    // attribute is: a fixture's copy of sysfs costs what sysfs does.
    // So is what a look finds at a name: a file, an entry, or nothing (a missing path, watched up
    // to where it stops).
    if (!announced_[i] && (read.absent || ((read.kind == Kind::kRead || read.kind == Kind::kLstat) &&
                                           read.status.ok()))) {
      identified_[i] = watches->WatchIdentity(read.path);
    }
  }
  for (size_t d = 0; d < directories_.size(); ++d) {
    if (!listed_[d]) continue;
    if (!ready()) return;
    directory_identified_[d] = watches->WatchIdentity(directories_[d]);
  }
  auto none = [](const std::vector<bool>& marks) {
    return std::find(marks.begin(), marks.end(), true) == marks.end();
  };
  if (inotify_ >= 0 && none(announced_) && none(identified_) && none(directory_identified_)) {
    CloseInotify();  // nothing it watches spares a read: not worth a read of its queue
  }
  ArmWake();
}

bool ScanInputs::EventCame() const {
  if (inotify_ < 0 || (wake_armed_ && !events_ready_)) return false;
  bool came = false;
  alignas(struct inotify_event) char buffer[4096];
  while (true) {
    const ssize_t n = read(inotify_, buffer, sizeof(buffer));
    if (n > 0) {
      came = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (!came) ArmWake();  // else the caller makes another instance
    return came;  // EAGAIN: read empty
  }
}

bool ScanInputs::Unchanged() const {
  if (!started_) return false;
  Group();
  // Watched before anything is read below, so that a change after that read sends an event.
  // After an event everything is read again, through watches made anew: the event may be the
  // end of one (a watched directory removed or moved away), and a change back leaves answers as
  // they were.
  // Reads recorded since the watches were set (no Clear() between) are not covered by them.
  if (watched_ && (announced_.size() != reads_.size() || EventCame())) {
    CloseInotify();
    watched_ = false;
  }
  if (!watched_) Watch();
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  const bool settings_due = now - settings_read_at_ >= setting_interval_;
  std::vector<bool> looked(reads_.size(), false);  // read in this call
  // Each directory is resolved when first needed in this call, as its entries are read, unless
  // one is kept from an earlier call (kept_directories_).
  std::vector<std::unique_ptr<HostDirectory>> directories(directories_.size());
  std::vector<bool> listed_now(directories_.size(), false);
  auto directory_at = [&](int d) -> const HostDirectory* {
    if (kept_directories_[d] != nullptr) return kept_directories_[d].get();
    if (directories[d] == nullptr) {
      directories[d] = std::make_unique<HostDirectory>(host_, directories_[d], listed_[d]);
    }
    return directories[d].get();
  };
  auto directory_of = [&](size_t i) -> const HostDirectory* {
    const int d = directory_of_[i];
    return d < 0 ? nullptr : directory_at(d);
  };
  for (size_t i = 0; i < reads_.size(); ++i) {
    const Read& read = reads_[i];
    const absl::string_view name = absl::string_view(read.path).substr(name_at_[i]);
    if (Settled(read) || verified_[i]) continue;
    if (read.reread == Reread::kSetting && !settings_due) continue;
    looked[i] = true;
    // Still nothing there: the same answer, without making it (a missing path's answer is an
    // error message, built anew each time).
    if (read.absent && (held_[i] || host_->Absent(read.path, read.kind != Kind::kLstat))) continue;
    switch (read.kind) {
      case Kind::kRead: {
        absl::StatusOr<std::string> content;
        std::optional<std::string> again;
        if (held_[i]) again = read.kept.ReadHeld(read.max_bytes);
        if (!again.has_value()) again = read.kept.ReadIfKernelFile(read.max_bytes);
        if (again.has_value()) {
          content = *std::move(again);  // its directory need not be resolved
        } else if (const HostDirectory* directory = directory_of(i); directory != nullptr) {
          content = directory->ReadFile(name, read.max_bytes, &read.kept);
        } else {
          content = host_->ReadFile(read.path, read.max_bytes);
        }
        if (content.ok() && read.part != nullptr) *content = read.part(*content);
        if (content.status() != read.status || (content.ok() && *content != read.text)) {
          return false;
        }
        break;
      }
      case Kind::kList: {
        const HostDirectory* directory = directory_of(i);
        absl::StatusOr<std::vector<std::string>> names =
            directory != nullptr ? directory->ListDirectory() : host_->ListDirectory(read.path);
        if (names.status() != read.status || (names.ok() && *names != read.names)) return false;
        if (directory != nullptr) listed_now[directory_of_[i]] = true;
        break;
      }
      case Kind::kStat:
      case Kind::kLstat: {
        const HostDirectory* directory = directory_of(i);
        const bool lstat = read.kind == Kind::kLstat;
        // The same entry: no event since it was looked at after its watches (a fixture's copy
        // of sysfs), or listed in this call under the inode number it had (sysfs itself).
        if (lstat && read.status.ok() &&
            (held_[i] || (directory != nullptr && listed_now[directory_of_[i]] &&
                          directory->OnSysfs() && directory->ListedAs(name, read.info)))) {
          break;
        }
        absl::StatusOr<FileInfo> info =
            directory != nullptr ? (lstat ? directory->Lstat(name) : directory->Stat(name))
                                 : (lstat ? host_->Lstat(read.path) : host_->Stat(read.path));
        if (info.status() != read.status || (info.ok() && *info != read.info)) return false;
        break;
      }
      case Kind::kExists: {
        const HostDirectory* directory = directory_of(i);
        const bool exists =
            directory != nullptr ? directory->Exists(name) : host_->Exists(read.path);
        if (exists != read.exists) return false;
        break;
      }
      case Kind::kResolve:
        if (host_->ResolveHostPath(read.path) != read.text) return false;
        break;
    }
  }
  verified_ = announced_;
  if (settings_due) settings_read_at_ = now;
  // A file is held once read after its watches were added: one left alone in this call (a
  // setting not due) may have been replaced before they were.
  for (size_t i = 0; i < reads_.size(); ++i) {
    held_[i] = identified_[i] && (held_[i] || looked[i]) &&
               (reads_[i].kind != Kind::kRead || reads_[i].absent || !reads_[i].kept.empty());
  }
  // A listed directory is kept for the next call where the name cannot lead to another one
  // unseen: no event comes while it does (a fixture's copy of sysfs); or, on sysfs, it listed
  // entries: a sysfs directory removed has none, so a kept one that was replaced lists none,
  // and the listing's comparison says so.
  for (size_t i = 0; i < reads_.size(); ++i) {
    const int d = directory_of_[i];
    if (reads_[i].kind != Kind::kList || d < 0 || directories[d] == nullptr) continue;
    if (directory_identified_[d] ||
        (directories[d]->OnSysfs() && reads_[i].status.ok() && !reads_[i].names.empty())) {
      kept_directories_[d] = std::move(directories[d]);
    }
  }
  return true;
}

}  // namespace edgeaccel
