// ScanInputs: what a discoverer's scan read that the kernel can change without saying so, kept
// so the probe can tell, by reading only that again, whether a scan now would find anything new.
//
// The kernel announces a device node appearing, vanishing or changing mode in /dev (inotify) and
// a device added, removed or rebound (uevents); a family's scan is run again for those. It does
// not announce a sysfs or procfs value changing (a temperature, a driver status, a GPU excluded),
// nor a file under /etc being rewritten. A discoverer makes every read of that kind through its
// ScanInputs, which reads through Host and records the path and the answer. Unchanged() makes
// the same reads again: when every answer is the one recorded, a scan would take the same steps
// and find the same devices, health and facts (a scan is a function of what it reads and of
// state that the same reads leave as it is), so the HostWatcher's probe need not run it.
//
// What is read through Host directly instead is only what the family's WatchPaths announce
// (its device nodes); with Reread::kUntilRead, what cannot change while the thing it belongs
// to stays (a device's PCI address, while the sysfs entry that names the device, read with
// kEveryProbe, is the same one); and with Reread::kFixedAtBoot, what cannot change while the
// system runs. Reread::kSetting marks what only an administrator's write changes (a threshold):
// compared once a minute, not on every probe.
#ifndef EDGEACCEL_DISCOVERY_SCAN_INPUTS_H_
#define EDGEACCEL_DISCOVERY_SCAN_INPUTS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "edgeaccel/host/host.h"

namespace edgeaccel {

class ScanInputs {
 public:
  // When Unchanged() reads an input again.
  enum class Reread {
    kEveryProbe,  // a value the kernel may change at any time (a temperature, a driver status)
    // A value the kernel keeps as an administrator last wrote it (a driver's temperature
    // threshold): read again once per setting interval (a minute by default), so a write is seen
    // within that, and the probes between leave it alone.
    kSetting,
    // A value fixed while what it belongs to stays: read again only while it could not be read
    // (an error may pass; a value, once there, does not change).
    kUntilRead,
    // A value the system fixes at boot (the firmware's device tree, the SoC's identity): never
    // read again, whether it was there or not.
    kFixedAtBoot,
  };

  static constexpr absl::Duration kSettingInterval = absl::Minutes(1);

  // `host` must outlive this object. `setting_interval`: how often Unchanged() reads a kSetting
  // value again.
  explicit ScanInputs(const Host* host, absl::Duration setting_interval = kSettingInterval)
      : host_(host), setting_interval_(absl::ToChronoNanoseconds(setting_interval)) {}
  ~ScanInputs();
  ScanInputs(const ScanInputs&) = delete;
  ScanInputs& operator=(const ScanInputs&) = delete;

  const Host& host() const { return *host_; }

  // Forgets what was recorded: the start of a scan.
  void Clear();

  // Host's reads, recorded. The answers are Host's, unchanged.
  absl::StatusOr<std::string> ReadFile(absl::string_view host_path, size_t max_bytes = 64 * 1024,
                                       Reread reread = Reread::kEveryProbe);
  absl::StatusOr<std::string> ReadAttribute(absl::string_view host_path,
                                            Reread reread = Reread::kEveryProbe);
  absl::StatusOr<int64_t> ReadInteger(absl::string_view host_path,
                                      Reread reread = Reread::kEveryProbe);
  // A file of which only a part matters (MemTotal of /proc/meminfo, whose other lines change all
  // the time): `part` picks it from the content; only that is returned, recorded and compared.
  using Part = std::string (*)(absl::string_view content);
  absl::StatusOr<std::string> ReadPart(absl::string_view host_path, Part part);
  absl::StatusOr<std::vector<std::string>> ListDirectory(absl::string_view host_path);
  absl::StatusOr<FileInfo> Stat(absl::string_view host_path);
  absl::StatusOr<FileInfo> Lstat(absl::string_view host_path);
  bool Exists(absl::string_view host_path);
  std::string ResolveHostPath(absl::string_view host_path);

  // Says whether every answer recorded since Clear() is still the one a read now would give.
  // Stops at the first that is not. False before the first Clear(): nothing was scanned yet.
  // kSetting values count only in the first call a setting interval after they were last read
  // (by the scan, or by a call that answered true); the calls between take them as recorded.
  //
  // What is on a filesystem that reports its changes (Host::WatchChanges: ext4, tmpfs, ...; a
  // host's /etc and /usr, a missing path's nearest directory) is watched with inotify from the
  // first call after a scan on, and read again only until one call found it unchanged: after
  // that, while no event came, its answer stands without a read. Any event makes the next call
  // read everything again. The rest (sysfs, procfs) is read again on every call:
  //  - a file through the descriptor kept from the call before (KeptFile) until the next
  //    Clear(): a kernel attribute costs one pread; another file one fstatat and one pread;
  //  - a directory's entries through one HostDirectory, resolved again for each call, or kept
  //    from the call before where its name cannot lead to another directory unseen: on sysfs,
  //    once it listed an entry (a removed sysfs directory lists none); an entry looked at there
  //    (Lstat) that this call's listing shows under the inode number it had is the same entry;
  //  - a missing path with one lookup that makes no answer (Host::Absent).
  // A fixture's copy of sysfs and procfs, on a filesystem that reports what would put another
  // file, entry or directory under a name (HostWatches::WatchIdentity), is read as the kernel's
  // is, content on every call, but what a name leads to (a kept file, a kept directory, an
  // entry, nothing at all) stands while no event came.
  bool Unchanged() const;

  // Has the owner of `epoll_fd` told when an inotify event for these inputs waits: the instance
  // that Unchanged() reads is registered there (EPOLLIN | EPOLLONESHOT, data.u64 = `token`) as
  // soon as it exists, and again after each read of its queue. The owner calls EventsReady() when
  // `epoll_fd` reports `token`; until then Unchanged() takes it that no event came, without a
  // read. `epoll_fd` -1: none (the queue is read on every call). From Unchanged()'s thread, and
  // again with -1 before `epoll_fd` is closed.
  void WakeThrough(int epoll_fd, uint64_t token);
  void EventsReady() { events_ready_ = true; }

  // How many reads are recorded (for tests).
  size_t size() const { return reads_.size(); }

 private:
  enum class Kind { kRead, kList, kStat, kLstat, kExists, kResolve };
  struct Read {
    Kind kind = Kind::kRead;
    std::string path;
    size_t max_bytes = 0;  // kRead
    Reread reread = Reread::kEveryProbe;
    Part part = nullptr;  // kRead: what of the content is kept (null: all of it)
    absl::Status status;  // the answer: an error, or OK with one of these
    // Nothing was at the path (Host::IsAbsence; for kExists, false): while Host::Absent() still
    // holds, the answer is the same, and Unchanged() need not make it again.
    bool absent = false;
    std::string text;               // kRead: the content; kResolve: the path
    std::vector<std::string> names;  // kList
    FileInfo info;                  // kStat, kLstat
    bool exists = false;            // kExists
    mutable KeptFile kept;          // kRead through a HostDirectory: the file, held open
  };

  // A new record of a `kind` look at `host_path` whose answer was `status`; the caller fills in
  // what the answer held.
  Read& Record(Kind kind, absl::string_view host_path, absl::Status status);

  // Whether Unchanged() leaves `read` alone: its answer cannot differ now.
  static bool Settled(const Read& read);

  // Which reads Unchanged() makes through a HostDirectory: a directory with more than one entry
  // to look at is resolved once per call, and listed through the same descriptor where it is
  // listed too; an entry alone in its directory is read by its path. Worked out once for what is
  // recorded (directory_of: an index into directories, or -1).
  void Group() const;

  // Adds the inotify watches for what is recorded, once after each Clear(): which reads they
  // cover goes to announced_.
  void Watch() const;
  // Whether an event came since the last call (the queue is read empty, where WakeThrough's
  // epoll said an event waits or there is none to say so).
  bool EventCame() const;
  // Registers the inotify instance with the WakeThrough epoll to report its next event.
  void ArmWake() const;
  // Closes the inotify instance, and with it its watches and its epoll registration.
  void CloseInotify() const;

  const Host* host_;
  const std::chrono::nanoseconds setting_interval_;
  bool started_ = false;
  // When kSetting values were last read: by the scan, or by a call that found them all unchanged.
  mutable std::chrono::steady_clock::time_point settings_read_at_;
  std::vector<Read> reads_;
  mutable size_t grouped_ = 0;  // reads_.size() when Group() last ran; 0: not since Clear()
  mutable std::vector<int> directory_of_;   // parallel to reads_
  mutable std::vector<size_t> name_at_;     // parallel to reads_: where the entry's name starts
  mutable std::vector<std::string> directories_;
  mutable std::vector<bool> listed_;  // parallel to directories_: one of the reads lists it
  mutable int inotify_ = -1;           // the watches of what is recorded; -1 before Watch()
  int wake_epoll_ = -1;                // WakeThrough's
  uint64_t wake_token_ = 0;
  mutable bool wake_added_ = false;  // inotify_ is in wake_epoll_
  // inotify_ is armed in wake_epoll_: its next event is reported there.
  mutable bool wake_armed_ = false;
  mutable bool events_ready_ = false;  // wake_epoll_ reported an event since inotify_ was armed
  mutable bool watched_ = false;       // Watch() ran since Clear()
  mutable std::vector<bool> announced_;  // parallel to reads_: an event comes on its change
  // Parallel to reads_: announced, and found unchanged by a call after its watches were added.
  mutable std::vector<bool> verified_;
  // Parallel to reads_: a file or entry whose content is not announced, or a missing path, that
  // a name leads to while no event comes (HostWatches::WatchIdentity).
  mutable std::vector<bool> identified_;
  // Parallel to reads_: identified, and looked at by a call after its watches were added (a file
  // kept open then): a file read through the descriptor alone; an entry, or nothing, taken as
  // it was without a look.
  mutable std::vector<bool> held_;
  // Parallel to directories_: a listed directory whose name leads to no other directory while
  // no event comes (HostWatches::WatchIdentity).
  mutable std::vector<bool> directory_identified_;
  // Parallel to directories_: a listed directory kept open from an earlier call, read through
  // without resolving its path again (null: resolved when needed).
  mutable std::vector<std::unique_ptr<HostDirectory>> kept_directories_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_SCAN_INPUTS_H_
