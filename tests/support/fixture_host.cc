#include "fixture_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <ftw.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "glog/logging.h"
#include "ld_so_cache_builder.h"

namespace edgeaccel::testing {
namespace {

void MakeParents(const std::string& path) {
  std::string prefix;
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    absl::StrAppend(&prefix, "/", parts[i]);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      PLOG(FATAL) << "mkdir " << prefix;
    }
  }
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;
}

void RemoveTree(const std::string& path) {
  nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace

std::string NulTerminated(std::initializer_list<absl::string_view> strings) {
  std::string out;
  for (absl::string_view s : strings) {
    out.append(s.data(), s.size());
    out.push_back('\0');
  }
  return out;
}


FullDisk::FullDisk(std::string directory, const std::string& size)
    : directory_(std::move(directory)) {
  mkdir(directory_.c_str(), 0755);
  if (mount("tmpfs", directory_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) {
    why_ = absl::StrCat("cannot mount a tmpfs here (", strerror(errno), "): needs CAP_SYS_ADMIN");
    return;
  }
  mounted_ = true;
  FILE* filler = fopen((directory_ + "/filler").c_str(), "w");
  const std::string block(1024, 'x');
  while (filler != nullptr && fwrite(block.data(), 1, block.size(), filler) == block.size() &&
         fflush(filler) == 0) {
  }
  if (filler != nullptr) fclose(filler);
}

FullDisk::~FullDisk() {
  if (mounted_) umount2(directory_.c_str(), MNT_DETACH);
}

void FullDisk::MakeRoom() const { unlink((directory_ + "/filler").c_str()); }

ReadOnlyDisk::ReadOnlyDisk(std::string directory) : directory_(std::move(directory)) {
  mkdir(directory_.c_str(), 0755);
  if (mount("tmpfs", directory_.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0) {
    why_ = absl::StrCat("cannot mount a tmpfs here (", strerror(errno), "): needs CAP_SYS_ADMIN");
    return;
  }
  mounted_ = true;
}

ReadOnlyDisk::~ReadOnlyDisk() {
  if (mounted_) umount2(directory_.c_str(), MNT_DETACH);
}

void ReadOnlyDisk::MakeWritable() const {
  PCHECK(mount(nullptr, directory_.c_str(), nullptr, MS_REMOUNT, "size=64k") == 0)
      << "remount " << directory_ << " read-write";
}

AllFdsTaken::AllFdsTaken() {
  PCHECK(getrlimit(RLIMIT_NOFILE, &saved_) == 0);
  struct rlimit low = saved_;
  low.rlim_cur = 4096;
  PCHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  while (true) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    taken_.push_back(fd);
  }
}

void AllFdsTaken::Give(size_t n) {
  for (; n > 0 && !taken_.empty(); --n) {
    close(taken_.back());
    taken_.pop_back();
  }
}

void AllFdsTaken::Restore() {
  if (restored_) return;
  restored_ = true;
  for (int fd : taken_) close(fd);
  taken_.clear();
  setrlimit(RLIMIT_NOFILE, &saved_);
}

StaleMount::StaleMount(std::string directory) : directory_(std::move(directory)) {
  char source[] = "/tmp/edgeaccel-stale-XXXXXX";
  PCHECK(mkdtemp(source) != nullptr);
  mkdir(directory_.c_str(), 0755);
  if (mount(source, directory_.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    why_ = absl::StrCat("cannot bind-mount here (", strerror(errno), "): needs CAP_SYS_ADMIN");
    rmdir(source);
    return;
  }
  PCHECK(rmdir(source) == 0);
  mounted_ = true;
}

StaleMount::~StaleMount() {
  if (mounted_) umount2(directory_.c_str(), MNT_DETACH);
}

HungSocket::HungSocket(const std::string& path) {
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PCHECK(fd_ >= 0) << "socket";
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  PCHECK(bind(fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0) << path;
  PCHECK(listen(fd_, 16) == 0) << path;
}

HungSocket::~HungSocket() { close(fd_); }

SilentTcpServer::SilentTcpServer() {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PCHECK(listener_ >= 0) << "socket";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  PCHECK(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) << "bind";
  PCHECK(listen(listener_, 64) == 0) << "listen";
  socklen_t length = sizeof(addr);
  PCHECK(getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  port_ = ntohs(addr.sin_port);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  PCHECK(stop_fd_ >= 0) << "eventfd";
  thread_ = std::thread([this] { Run(); });
}

SilentTcpServer::~SilentTcpServer() {
  const uint64_t one = 1;
  PCHECK(write(stop_fd_, &one, sizeof(one)) == sizeof(one));
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (int fd : connections_) close(fd);
  close(stop_fd_);
  close(listener_);
}

void SilentTcpServer::Run() {
  while (true) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[1].revents != 0) return;
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    connections_.push_back(fd);
  }
}

bool SilentTcpServer::WaitForConnections(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto arrived = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(connections_.size()) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
}

std::string Threads(pid_t pid) {
  std::string out;
  DIR* tasks = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (tasks == nullptr) return out;
  while (dirent* task = readdir(tasks)) {
    if (task->d_name[0] == '.') continue;  // "..": the process's own comm again
    std::ifstream comm(absl::StrCat("/proc/", pid, "/task/", task->d_name, "/comm"));
    std::string name;
    if (std::getline(comm, name)) out += name + " ";
  }
  closedir(tasks);
  return out;
}

namespace {

// "<tid>:<name> " for each of `pid`'s threads, in /proc's order.
std::string ThreadIdsAndNames(pid_t pid) {
  std::string out;
  DIR* tasks = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (tasks == nullptr) return out;
  while (dirent* task = readdir(tasks)) {
    if (task->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat("/proc/", pid, "/task/", task->d_name, "/comm"));
    std::string name;
    if (std::getline(comm, name)) absl::StrAppend(&out, task->d_name, ":", name, " ");
  }
  closedir(tasks);
  return out;
}

}  // namespace

std::string SettledThreads(pid_t pid) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  std::string before = ThreadIdsAndNames(pid);
  while (true) {
    absl::SleepFor(absl::Milliseconds(300));
    std::string now = ThreadIdsAndNames(pid);
    if (now == before || absl::Now() >= give_up) break;
    before = std::move(now);
  }
  return Threads(pid);
}

int ThreadsCalled(const std::string& threads, absl::string_view name, bool called) {
  int n = 0;
  for (absl::string_view thread : absl::StrSplit(threads, ' ', absl::SkipEmpty())) {
    n += (thread == name) == called;
  }
  return n;
}

int NamedThreads(const std::string& threads) {
  return ThreadsCalled(threads, "edgeaccel-devic", /*called=*/false);
}

int BudgetedThreads(const std::string& threads) {
  const int executors = ThreadsCalled(threads, "default-executo");
  return NamedThreads(threads) - (executors > 1 ? executors - 1 : 0);
}

std::map<std::string, int64_t> WakeUpsByThread(pid_t pid) {
  std::map<std::string, int64_t> out;
  const std::string tasks = pid == 0 ? std::string("/proc/self/task") : absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return out;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream status(tasks + "/" + entry->d_name + "/status");
    std::string line, name;
    int64_t switches = 0;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "Name:\t")) name = line.substr(6);
      for (const char* key : {"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"}) {
        int64_t count = 0;
        if (absl::StartsWith(line, key) && absl::SimpleAtoi(line.substr(strlen(key)), &count)) {
          switches += count;
        }
      }
    }
    out[name] += switches;
  }
  closedir(dir);
  return out;
}

std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& [name, switches] : WakeUpsByThread()) names.push_back(name);
  return names;
}

bool WaitForChange(absl::Mutex& mu, const uint64_t& version, const std::function<bool()>& condition,
                   absl::Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // The analysis cannot tie `version` to `mu` through references; every read is under `mu`.
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    uint64_t seen;
    {
      absl::MutexLock lock(&mu);
      seen = version;
    }
    if (condition()) return true;
    bool changed;
    {
      absl::MutexLock lock(&mu);
      auto newer = [&version, seen]() { return version != seen; };
      changed = mu.AwaitWithDeadline(absl::Condition(&newer), deadline);
    }
    if (!changed) return condition();
  }
}

std::string ReadFileText(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool PathExists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void MakeStaleSocket(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PCHECK(fd >= 0) << "socket";
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  PCHECK(bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0) << "bind " << path;
  close(fd);
}

TempDir::TempDir(absl::string_view prefix) {
  std::string templ = absl::StrCat("/tmp/", prefix, "-XXXXXX");
  char* made = mkdtemp(templ.data());
  PCHECK(made != nullptr) << "mkdtemp " << templ;
  path_ = made;
}

TempDir::~TempDir() {
  if (!keep_) RemoveTree(path_);
}

FixtureHost::FixtureHost() : dir_("edgeaccel-host") {
  // Every Linux host has one (random per boot; the kernel's random driver). A test of a reboot
  // writes another.
  WriteFile("/proc/sys/kernel/random/boot_id", absl::StrCat(kBootId, "\n"));
}

std::string FixtureHost::Path(absl::string_view host_path) const {
  return absl::StrCat(root(), host_path);
}

void FixtureHost::WriteFile(absl::string_view host_path, absl::string_view content) const {
  const std::string path = Path(host_path);
  MakeParents(path);
  // Write then rename: a reader sees the old value or the new one, never a half-written file,
  // just as a sysfs read is atomic.
  const std::string temp = path + ".tmp~";
  FILE* f = fopen(temp.c_str(), "w");
  PCHECK(f != nullptr) << "fopen " << temp;
  fwrite(content.data(), 1, content.size(), f);
  fclose(f);
  PCHECK(rename(temp.c_str(), path.c_str()) == 0) << "rename " << path;
}

void FixtureHost::OverwriteInPlace(absl::string_view host_path, absl::string_view content,
                                   struct timespec modified) const {
  const std::string path = Path(host_path);
  FILE* f = fopen(path.c_str(), "r+");
  PCHECK(f != nullptr) << "fopen " << path;
  PCHECK(ftruncate(fileno(f), 0) == 0) << "ftruncate " << path;
  fwrite(content.data(), 1, content.size(), f);
  fclose(f);
  const struct timespec times[2] = {{0, UTIME_OMIT}, modified};
  PCHECK(utimensat(AT_FDCWD, path.c_str(), times, 0) == 0) << "utimensat " << path;
}

struct timespec FixtureHost::Modified(absl::string_view host_path) const {
  struct stat st;
  const std::string path = Path(host_path);
  PCHECK(stat(path.c_str(), &st) == 0) << "stat " << path;
  return st.st_mtim;
}

void FixtureHost::MakeDirectory(absl::string_view host_path) const {
  const std::string path = Path(host_path);
  MakeParents(path + "/x");
}

void FixtureHost::MakeCharDevice(absl::string_view host_path, unsigned major, unsigned minor,
                                 mode_t mode) const {
  const std::string path = Path(host_path);
  MakeParents(path);
  unlink(path.c_str());
  PCHECK(mknod(path.c_str(), S_IFCHR | mode, makedev(major, minor)) == 0)
      << "mknod " << path << " (the tests must run as root)";
}

void FixtureHost::MakeBlockDevice(absl::string_view host_path, unsigned major,
                                  unsigned minor) const {
  const std::string path = Path(host_path);
  MakeParents(path);
  unlink(path.c_str());
  PCHECK(mknod(path.c_str(), S_IFBLK | 0660, makedev(major, minor)) == 0) << "mknod " << path;
}

void FixtureHost::Symlink(absl::string_view target, absl::string_view host_path) const {
  const std::string path = Path(host_path);
  MakeParents(path);
  unlink(path.c_str());
  PCHECK(symlink(std::string(target).c_str(), path.c_str()) == 0) << "symlink " << path;
}

void FixtureHost::Remove(absl::string_view host_path) const { RemoveTree(Path(host_path)); }

absl::StatusOr<std::string> AnnounceLoopDevice() {
  int control = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (control < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open /dev/loop-control: ", strerror(errno)));
  }
  // A high index that does not exist: LOOP_CTL_ADD fails with EEXIST for one that does, and
  // never touches a loop device someone else uses.
  for (int index = 4000 + getpid() % 1000; index < 6000; index += 7) {
    if (ioctl(control, LOOP_CTL_ADD, index) < 0) {
      if (errno == EEXIST) continue;
      const int err = errno;
      close(control);
      return absl::UnavailableError(absl::StrCat("LOOP_CTL_ADD: ", strerror(err)));
    }
    ioctl(control, LOOP_CTL_REMOVE, index);
    close(control);
    return absl::StrCat("loop", index);
  }
  close(control);
  return absl::UnavailableError("no free loop index");
}

void FixtureHost::RegisterCharMajor(unsigned major, absl::string_view name) const {
  // /proc/devices: "Character devices:" then "%3d %s" lines by major, a blank line, then
  // "Block devices:".
  std::map<unsigned, std::string> majors;
  if (FILE* f = fopen(Path("/proc/devices").c_str(), "r")) {
    char line[256];
    bool chars = false;
    while (fgets(line, sizeof(line), f)) {
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (text == "Character devices:") chars = true;
      if (text == "Block devices:" || text.empty()) chars = false;
      unsigned number;
      std::vector<absl::string_view> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
      if (chars && parts.size() == 2 && absl::SimpleAtoi(parts[0], &number)) {
        majors[number] = std::string(parts[1]);
      }
    }
    fclose(f);
  }
  majors[major] = std::string(name);
  std::string out = "Character devices:\n";
  for (const auto& [number, driver] : majors) absl::StrAppendFormat(&out, "%3u %s\n", number, driver);
  out += "\nBlock devices:\n  8 sd\n259 blkext\n";
  WriteFile("/proc/devices", out);
}

void FixtureHost::MakeKernelCharDevice(absl::string_view dev_name, unsigned major, unsigned minor,
                                       mode_t mode) const {
  MakeCharDevice(absl::StrCat("/dev/", dev_name), major, minor, mode);
  const std::string device =
      absl::StrCat("/sys/devices/virtual/fixture/", absl::StrReplaceAll(dev_name, {{"/", "!"}}));
  WriteFile(device + "/dev", absl::StrCat(major, ":", minor, "\n"));
  WriteFile(device + "/uevent",
            absl::StrCat("MAJOR=", major, "\nMINOR=", minor, "\nDEVNAME=", dev_name, "\n"));
  Symlink(absl::StrCat("../../devices/virtual/fixture/", absl::StrReplaceAll(dev_name, {{"/", "!"}})),
          absl::StrCat("/sys/dev/char/", major, ":", minor));
}

void FixtureHost::AddCoralPcie(const CoralPcie& tpu) const {
  const std::string name = absl::StrCat("apex_", tpu.index);
  const std::string pci = absl::StrCat("/sys/devices/pci0000:00/", tpu.pci_address);
  WriteFile(pci + "/vendor", "0x1ac1\n");
  WriteFile(pci + "/device", "0x089a\n");
  WriteFile(pci + "/class", "0x0880ff\n");
  WriteFile(pci + "/numa_node", absl::StrCat(tpu.numa_node, "\n"));
  const std::string sys = absl::StrCat(pci, "/apex/", name);
  // Gasket's generic attributes, then apex's (docs/host-facts.md §1.5); thresholds read back as
  // the driver encodes them.
  WriteFile(sys + "/status", tpu.status + "\n");
  WriteFile(sys + "/driver_version", "1.2\n");
  WriteFile(sys + "/framework_version", "1.1.4\n");
  WriteFile(sys + "/device_type", "apex\n");
  WriteFile(sys + "/pci_address", tpu.pci_address + "\n");
  WriteFile(sys + "/is_device_owned", "0\n");
  WriteFile(sys + "/device_owner", "0\n");
  WriteFile(sys + "/dev", absl::StrCat("120:", tpu.index, "\n"));
  WriteFile(sys + "/temp", absl::StrCat(tpu.temp_mc, "\n"));
  WriteFile(sys + "/trip_point0_temp", "84800\n");
  WriteFile(sys + "/trip_point1_temp", "89800\n");
  WriteFile(sys + "/trip_point2_temp", "94800\n");
  WriteFile(sys + "/hw_temp_warn1", "99800\n");
  WriteFile(sys + "/hw_temp_warn1_en", "0\n");
  WriteFile(sys + "/hw_temp_warn2", "99800\n");
  WriteFile(sys + "/hw_temp_warn2_en", "1\n");
  WriteFile(sys + "/temp_poll_interval", "5000\n");
  Symlink(absl::StrCat("../../../", tpu.pci_address), sys + "/device");
  Symlink(absl::StrCat("../../devices/pci0000:00/", tpu.pci_address, "/apex/", name),
          "/sys/class/apex/" + name);
  WriteFile("/proc/modules",
            "apex 20480 - - Live 0xffffffffc01c9000 (O)\n"
            "gasket 94208 - - Live 0xffffffffc01aa000 (O)\n");
  // The node last, as udev would: by then the sysfs side is complete.
  MakeCharDevice(absl::StrCat("/dev/", name), 120, tpu.index);
}

void FixtureHost::UnplugCoralPcie(unsigned index, absl::string_view pci_address) const {
  Remove(absl::StrCat("/dev/apex_", index));
  Remove(absl::StrCat("/sys/class/apex/apex_", index));
  Remove(absl::StrCat("/sys/devices/pci0000:00/", pci_address));
}

void FixtureHost::SetApexAttribute(unsigned index, absl::string_view attribute,
                                   absl::string_view value) const {
  WriteFile(absl::StrCat("/sys/class/apex/apex_", index, "/", attribute), value);
}

void FixtureHost::AddCoralUsb(const CoralUsb& usb) const {
  const std::string sys = "/sys/bus/usb/devices/" + usb.port;
  WriteFile(sys + "/idVendor", usb.firmware_loaded ? "18d1\n" : "1a6e\n");
  WriteFile(sys + "/idProduct", usb.firmware_loaded ? "9302\n" : "089a\n");
  WriteFile(sys + "/busnum", absl::StrCat(usb.bus, "\n"));
  WriteFile(sys + "/devnum", absl::StrCat(usb.dev, "\n"));
  WriteFile(sys + "/speed", usb.speed + "\n");
  // The interface directory, which is not a device.
  WriteFile(sys + ":1.0/bInterfaceNumber", "00\n");
  MakeCharDevice(absl::StrFormat("/dev/bus/usb/%03d/%03d", usb.bus, usb.dev), 189,
                 (usb.bus - 1) * 128 + (usb.dev - 1));
}

void FixtureHost::ReenumerateCoralUsb(const CoralUsb& before, const CoralUsb& after) const {
  Remove(absl::StrFormat("/dev/bus/usb/%03d/%03d", before.bus, before.dev));
  AddCoralUsb(after);
}

void FixtureHost::UnplugCoralUsb(const CoralUsb& usb) const {
  Remove(absl::StrFormat("/dev/bus/usb/%03d/%03d", usb.bus, usb.dev));
  Remove(absl::StrCat("/sys/bus/usb/devices/", usb.port, ":1.0"));
  Remove(absl::StrCat("/sys/bus/usb/devices/", usb.port));
}

void FixtureHost::AddJetson(Jetson board) const {
  struct Spec {
    std::string release, model, compatible, family, devfreq, thermal_type;
    std::vector<std::string> nodes;  // under /dev
  };
  Spec spec;
  switch (board) {
    case Jetson::kNanoR32:
      spec.release =
          "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: "
          "Sat Feb 19 17:05:08 UTC 2022\n"
          "0c165125388fbd943e7f8b37a272dec7c5d57c15 */usr/lib/aarch64-linux-gnu/tegra/libnvmm.so\n";
      spec.model = NulTerminated({"NVIDIA Jetson Nano Developer Kit"});
      spec.compatible = NulTerminated({"nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"});
      spec.family = "Tegra210";
      spec.devfreq = "57000000.gpu";
      spec.thermal_type = "GPU-therm";
      spec.nodes = {"nvhost-as-gpu", "nvhost-ctrl", "nvhost-ctrl-gpu", "nvhost-dbg-gpu",
                    "nvhost-gpu", "nvhost-msenc", "nvhost-nvdec", "nvhost-nvjpg",
                    "nvhost-prof-gpu", "nvhost-tsg-gpu", "nvhost-vic", "nvmap",
                    // Display (tegra_dc, the framebuffer), never the GPU's to hand out.
                    "tegra_dc_0", "tegra_dc_1", "tegra_dc_ctrl", "fb0"};
      break;
    case Jetson::kXavierNxR35:
      spec.release =
          "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: "
          "Tue Aug  1 19:57:35 UTC 2023\n";
      spec.model = NulTerminated({"NVIDIA Jetson Xavier NX Developer Kit"});
      spec.compatible =
          NulTerminated({"nvidia,p3509-0000+p3668-0001", "nvidia,jetson-xavier-nx", "nvidia,tegra194"});
      spec.family = "Tegra194";
      spec.devfreq = "17000000.gv11b";
      spec.thermal_type = "GPU-therm";
      // As nvidia-ctk listed them on a Xavier NX with R35.5 (lf-edge/eve pkg/nvidia/cdi).
      spec.nodes = {"fb0", "fb1", "nvhost-as-gpu", "nvhost-ctrl", "nvhost-ctrl-gpu",
                    "nvhost-ctrl-nvdla0", "nvhost-ctrl-nvdla1", "nvhost-ctrl-pva0",
                    "nvhost-ctrl-pva1", "nvhost-dbg-gpu", "nvhost-gpu", "nvhost-msenc",
                    "nvhost-nvdec", "nvhost-nvdec1", "nvhost-nvdla0", "nvhost-nvdla1",
                    "nvhost-nvenc1", "nvhost-nvjpg", "nvhost-prof-gpu", "nvhost-pva0",
                    "nvhost-pva1", "nvhost-vic", "nvmap", "tegra_dc_0", "tegra_dc_1",
                    "tegra_dc_ctrl", "nvgpu/igpu0/as", "nvgpu/igpu0/channel", "nvgpu/igpu0/ctrl",
                    "nvgpu/igpu0/ctxsw", "nvgpu/igpu0/dbg", "nvgpu/igpu0/power", "nvgpu/igpu0/prof",
                    "nvgpu/igpu0/prof-ctx", "nvgpu/igpu0/prof-dev", "nvgpu/igpu0/tsg"};
      break;
    case Jetson::kAgxOrinR36:
    case Jetson::kIgxOrinR36:
      spec.release =
          "# R36 (release), REVISION: 4.7, GCID: 42132812, BOARD: generic, EABI: aarch64, DATE: "
          "Thu Sep 18 22:54:44 UTC 2025\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
          "TARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n";
      spec.model = NulTerminated({"NVIDIA Jetson AGX Orin Developer Kit"});
      spec.compatible = NulTerminated({"nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234", "nvidia,tegra23x"});
      spec.family = "Tegra234";
      spec.devfreq = "17000000.gpu";
      spec.thermal_type = "gpu-thermal";
      spec.nodes = {"nvhost-as-gpu", "nvhost-ctrl-gpu", "nvhost-ctxsw-gpu", "nvhost-dbg-gpu",
                    "nvhost-gpu", "nvhost-nvsched-gpu", "nvhost-nvsched_ctrl_fifo-gpu",
                    "nvhost-power-gpu", "nvhost-prof-ctx-gpu", "nvhost-prof-dev-gpu",
                    "nvhost-prof-gpu", "nvhost-sched-gpu", "nvhost-tsg-gpu", "nvmap",
                    "nvgpu/igpu0/as", "nvgpu/igpu0/channel", "nvgpu/igpu0/ctrl",
                    "nvgpu/igpu0/ctxsw", "nvgpu/igpu0/dbg", "nvgpu/igpu0/nvsched",
                    "nvgpu/igpu0/nvsched_ctrl_fifo", "nvgpu/igpu0/power", "nvgpu/igpu0/prof",
                    "nvgpu/igpu0/prof-ctx", "nvgpu/igpu0/prof-dev", "nvgpu/igpu0/sched",
                    "nvgpu/igpu0/tsg", "dri/renderD128", "host1x-fence",
                    // R36 on AGX Orin also has (nvidia-ctk's list, lf-edge/eve jp6): the DLA and
                    // PVA control nodes, NvSciIpc, the V4L2 codec stand-ins, and display nodes.
                    "nvhost-ctrl-nvdla0", "nvhost-ctrl-nvdla1", "nvhost-ctrl-pva0", "nvsciipc",
                    "v4l2-nvenc", "v4l2-nvdec", "fb0", "dri/card0"};
      if (board == Jetson::kAgxOrinR36) {
        // The iGPU's display driver nvidia.ko. On an IGX board in dGPU mode it is not loaded
        // (it conflicts with the discrete GPU's nvidia.ko; NVIDIA's IGX user guide).
        for (const char* node : {"nvidia0", "nvidiactl", "nvidia-modeset"}) spec.nodes.push_back(node);
      } else {
        spec.model = NulTerminated({"NVIDIA IGX Orin Developer Kit"});  // [INF] model string
      }
      break;
  }
  WriteFile("/etc/nv_tegra_release", spec.release);
  // The kernel's device tree, and /proc/device-tree linking to it. Relative here: the fixture's
  // own helpers (and the test kubelet) open fixture paths directly, where an absolute link would
  // lead out of the tree; the daemon follows the board's absolute link inside --host-root
  // (host_test's ResolutionTest).
  WriteFile("/sys/firmware/devicetree/base/model", spec.model);
  WriteFile("/sys/firmware/devicetree/base/compatible", spec.compatible);
  Symlink("../sys/firmware/devicetree/base", "/proc/device-tree");
  WriteFile("/sys/devices/soc0/family", spec.family + "\n");
  WriteFile("/proc/meminfo", "MemTotal:        3964656 kB\nMemFree:          123456 kB\n");
  // The GPU platform device with its load, and its devfreq entry (class link, device link).
  const std::string gpu = "/sys/devices/platform/gpu.0";
  WriteFile(gpu + "/load", "125\n");
  WriteFile(gpu + "/railgate_enable", "1\n");
  WriteFile(gpu + "/of_node/name", "gpu");
  const std::string devfreq = gpu + "/devfreq/" + spec.devfreq;
  WriteFile(devfreq + "/cur_freq", "76800000\n");
  Symlink("../../../gpu.0", devfreq + "/device");
  Symlink("../../devices/platform/gpu.0/devfreq/" + spec.devfreq, "/sys/class/devfreq/" + spec.devfreq);
  // Thermal zones, with the constant PMIC-Die and the GPU zone.
  WriteFile("/sys/class/thermal/thermal_zone0/type", "CPU-therm\n");
  WriteFile("/sys/class/thermal/thermal_zone0/temp", "31000\n");
  WriteFile("/sys/class/thermal/thermal_zone1/type", spec.thermal_type + "\n");
  WriteFile("/sys/class/thermal/thermal_zone1/temp", "26500\n");
  WriteFile("/sys/class/thermal/thermal_zone2/type", "PMIC-Die\n");
  WriteFile("/sys/class/thermal/thermal_zone2/temp", "100000\n");
  // Every node as the kernel registered it: a major per driver region (/proc/devices), and
  // /sys/dev/char/M:m naming the node (DEVNAME) for those made by device_create
  // (docs/host-facts.md §0.2-0.3, §3.5; docs/tegra-device-nodes.md on nvgpu, nvhost, nvmap,
  // host1x-fence, tegra_dc, drm). Majors are dynamic on a real board; these are plausible ones.
  const unsigned gpu_major = 492;  // nvgpu: a region named after the GPU platform device
  unsigned gpu_minor = 0;
  unsigned next_nvhost_major = 500;  // nvhost: one region per engine, all named "nvhost"
  std::map<std::string, std::pair<unsigned, unsigned>> nvhost_regions;  // engine -> major, next minor
  RegisterCharMajor(1, "mem");
  RegisterCharMajor(238, "ttyTHS");
  for (const std::string& node : spec.nodes) {
    if (node == "nvmap") {
      RegisterCharMajor(10, "misc");
      MakeKernelCharDevice(node, 10, 62);
      WriteFile("/sys/class/misc/nvmap/dev", "10:62\n");
    } else if (absl::StartsWith(node, "dri/")) {
      RegisterCharMajor(226, "drm");
      MakeKernelCharDevice(node, 226, absl::StartsWith(node, "dri/renderD") ? 128 : 0);
    } else if (absl::StartsWith(node, "fb")) {
      RegisterCharMajor(29, "fb");
      MakeKernelCharDevice(node, 29, static_cast<unsigned>(node.back() - '0'));
    } else if (absl::StartsWith(node, "tegra_dc_")) {
      RegisterCharMajor(489, "tegra_dc_ext");
      MakeKernelCharDevice(node, 489, node == "tegra_dc_ctrl" ? 2 : static_cast<unsigned>(node.back() - '0'));
    } else if (node == "host1x-fence") {
      RegisterCharMajor(495, "host1x-fence");
      MakeKernelCharDevice(node, 495, 0);
    } else if (node == "nvsciipc") {
      RegisterCharMajor(496, "nvsciipc");
      MakeKernelCharDevice(node, 496, 0);
    } else if (absl::StartsWith(node, "v4l2-nv")) {
      // JetPack's udev rule: mknod -m 666 /dev/v4l2-nvenc c 1 3 (a stand-in named like /dev/null).
      MakeCharDevice("/dev/" + node, 1, 3, 0666);
    } else if (absl::StartsWith(node, "nvidia")) {
      // The display driver nvidia.ko (fixed major 195) registers no sysfs device for its nodes.
      RegisterCharMajor(195, "nvidia-frontend");
      MakeCharDevice("/dev/" + node, 195, node == "nvidiactl" ? 255 : node == "nvidia-modeset" ? 254 : 0);
    } else if (absl::StartsWith(node, "nvgpu/") || absl::EndsWith(node, "-gpu") || node == "nvhost-gpu") {
      RegisterCharMajor(gpu_major, spec.devfreq);
      MakeKernelCharDevice(node, gpu_major, gpu_minor++);
    } else {  // nvhost-ctrl, nvhost-<engine>, nvhost-ctrl-<engine>
      std::string engine(absl::StripPrefix(absl::StripPrefix(node, "nvhost-"), "ctrl-"));
      auto [it, fresh] = nvhost_regions.try_emplace(engine, next_nvhost_major, 0);
      if (fresh) ++next_nvhost_major;
      RegisterCharMajor(it->second.first, "nvhost");
      MakeKernelCharDevice(node, it->second.first, it->second.second++);
    }
  }
  // Not the GPU's: must not be handed out.
  MakeKernelCharDevice("ttyTHS1", 238, 1);
  MakeCharDevice("/dev/nvme0n1", 259, 0);
}

void FixtureHost::AddNvidiaGpu(const NvidiaGpu& gpu) const {
  WriteFile("/proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022\n"
            "GCC version:  gcc version 7.5.0 (Ubuntu 7.5.0-3ubuntu1~18.04)\n");
  WriteFile(absl::StrCat("/proc/driver/nvidia/gpus/", gpu.pci_address, "/information"),
            absl::StrCat("Model: \t\t ", gpu.model, "\nIRQ:   \t\t 16\nGPU UUID: \t ", gpu.uuid,
                         "\nVideo BIOS: \t 95.04.65.00.13\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                         "DMA Mask: \t 0x7fffffffffff\nBus Location: \t ", gpu.pci_address,
                         "\nDevice Minor: \t ", gpu.minor, "\nGPU Excluded:\t No\n"));
  WriteFile(absl::StrCat("/sys/bus/pci/devices/", gpu.pci_address, "/numa_node"),
            absl::StrCat(gpu.numa_node, "\n"));
  WriteFile(absl::StrCat("/sys/bus/pci/devices/", gpu.pci_address, "/vendor"), "0x10de\n");
  RegisterCharMajor(195, "nvidia-frontend");
  RegisterCharMajor(510, "nvidia-uvm");
  MakeCharDevice(absl::StrCat("/dev/nvidia", gpu.minor), 195, gpu.minor, 0666);
  MakeCharDevice("/dev/nvidiactl", 195, 255, 0666);
  MakeCharDevice("/dev/nvidia-modeset", 195, 254, 0666);
  MakeCharDevice("/dev/nvidia-uvm", 510, 0, 0666);
  MakeCharDevice("/dev/nvidia-uvm-tools", 510, 1, 0666);
}

void FixtureHost::AddNvidiaDriverFiles(const NvidiaDriverFiles& files) const {
#if defined(__aarch64__)
  constexpr int32_t kNativeFlags = 0x0a03;  // libc6, AArch64
#else
  constexpr int32_t kNativeFlags = 0x0303;  // libc6, x86-64
#endif
  LdSoCacheBuilder cache;
  for (const std::string& soname : files.sonames) {
    // libcuda.so.1 -> libcuda.so.515.76; a soname that carries the version is the file itself.
    const std::string file = absl::StrCat(soname.substr(0, soname.find(".so.")), ".so.", files.version);
    WriteFile(absl::StrCat(files.root, files.directory, "/", file), files.content);
    if (file != soname) Symlink(file, absl::StrCat(files.root, files.directory, "/", soname));
    cache.Add(kNativeFlags, soname, absl::StrCat(files.directory, "/", soname));
  }
  WriteFile(absl::StrCat(files.root, "/etc/ld.so.cache"), cache.New());
  if (files.nvidia_smi) {
    const std::string smi = absl::StrCat(files.root, "/usr/bin/nvidia-smi");
    WriteFile(smi, files.content);
    chmod(Path(smi).c_str(), 0755);
  }
}

std::string FixtureHost::FakeNvmlLibrary() {
  std::ifstream in(EDGEACCEL_FAKE_NVML_PATH, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void FixtureHost::AddFakeNvml(const std::string& script, const std::string& library) const {
  WriteFile(library, FakeNvmlLibrary());
  chmod((root() + library).c_str(), 0755);
  NvmlScript(script, library);
  WriteFile(library + ".events", "");
}

void FixtureHost::NvmlScript(const std::string& script, const std::string& library) const {
  const std::string path = root() + library + ".script";
  {
    std::ofstream out(path + ".new");
    out << script;
  }
  if (rename((path + ".new").c_str(), path.c_str()) != 0) {
    LOG(FATAL) << "cannot write " << path << ": " << strerror(errno);
  }
}

void FixtureHost::NvmlEvent(const std::string& line, const std::string& library) const {
  std::ofstream(root() + library + ".events", std::ios::app) << line << "\n";
}

}  // namespace edgeaccel::testing
