// Fake host trees (dev/ sys/ proc/ etc/) built from what real machines expose
// (docs/host-facts.md gives each fact and its source; add to it when writing new ones). Device
// nodes are real character devices made with mknod, so the tests must run as root.
#ifndef EDGEACCEL_TESTS_SUPPORT_FIXTURE_HOST_H_
#define EDGEACCEL_TESTS_SUPPORT_FIXTURE_HOST_H_

#include <sys/types.h>

#include <cstdint>
#include <sys/resource.h>
#include <time.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace edgeaccel::testing {

// A fresh directory under /tmp (short, so Unix socket paths inside it fit), removed with
// everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(absl::string_view prefix = "edgeaccel");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Leaves the directory in place when this object goes (for a fixture a tool hands on).
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// Leaves a socket file at `path` that nobody accepts on, as a crashed process does.
void MakeStaleSocket(const std::string& path);

// The whole content of the file at `path` ("" if it cannot be read), and whether `path` exists.
std::string ReadFileText(const std::string& path);
bool PathExists(const std::string& path);

// The threads of process `pid` (0: this one) by name (/proc/<pid>/task/*/status: cut at 15
// characters), each with the sum of its voluntary and involuntary context switches (threads of
// one name added up): how often they woke. And this process's thread names alone.
std::map<std::string, int64_t> WakeUpsByThread(pid_t pid = 0);
std::vector<std::string> ThreadNames();
// The names of process `pid`'s threads, each followed by a space.
std::string Threads(pid_t pid);
// The same once they have settled: the same threads (by id) and names in two looks 300 ms apart,
// looked for up to 10 s (the last look then). A thread just made carries its maker's name until
// it names itself, and one that works a moment comes and goes: neither is what the process idles
// with.
std::string SettledThreads(pid_t pid);
// How many of `threads` (as Threads() lists them) are called `name`, or are not.
int ThreadsCalled(const std::string& threads, absl::string_view name, bool called = true);
// The daemon's threads but main: those named otherwise than the process (main's name is the
// process's, which a sanitizer's own thread, under TSan, carries too).
int NamedThreads(const std::string& threads);
// What the thread budget counts of `threads`: NamedThreads, with gRPC's default executor as one
// thread however many it has grown to. gRPC 1.51's executor starts with one thread and adds one,
// kept until exit, when a closure is handed to it while three wait for it (iomgr/executor.cc,
// MAX_DEPTH: a transport's combiner hands it the rest of its work whenever a completion queue
// has an event ready) or while its thread runs the TCP write backup poller; up to two per core,
// with no setting to bound it (grpc/grpc#16557). A loaded 2-core machine grew it in 6 of 120
// runs of three thread tests (three copies at once beside a build). Those threads wait on a
// condition variable: they never wake idle.
int BudgetedThreads(const std::string& threads);

// Waits (up to `timeout`) until `condition` holds, looking again each time `version` moves: a
// double's change counter, guarded by `mu` and raised under it on every change. No polling.
// `condition` runs without `mu` held. True if it held.
bool WaitForChange(absl::Mutex& mu, const uint64_t& version, const std::function<bool()>& condition,
                   absl::Duration timeout);

// A socket that accepts connections (the kernel's backlog does) but never says a word: a hung
// process. Closed when this object goes; the file stays.
class HungSocket {
 public:
  explicit HungSocket(const std::string& path);
  ~HungSocket();
  HungSocket(const HungSocket&) = delete;
  HungSocket& operator=(const HungSocket&) = delete;

 private:
  int fd_ = -1;
};

// An API server that accepts TCP connections on 127.0.0.1 and never says a word (not even its
// TLS greeting): a hung or overloaded kube-apiserver behind a live listener. Each connection is
// taken and held open, so a client's request stays in its TLS handshake until it gives up.
class SilentTcpServer {
 public:
  SilentTcpServer();
  ~SilentTcpServer();
  SilentTcpServer(const SilentTcpServer&) = delete;
  SilentTcpServer& operator=(const SilentTcpServer&) = delete;

  int port() const { return port_; }
  // Waits (up to `timeout`) until `n` connections in all have arrived; true if they did.
  bool WaitForConnections(int n, absl::Duration timeout);

 private:
  void Run();
  int listener_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  absl::Mutex mu_;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A full disk: a tmpfs of `size` ("8k") mounted at `directory` (made if missing) and filled to
// the last byte by a file "filler". Unmounted when this object goes, even after a failed
// assertion. Mounting needs CAP_SYS_ADMIN: where that is missing, mounted() is false and why()
// says so (for GTEST_SKIP).
class FullDisk {
 public:
  FullDisk(std::string directory, const std::string& size);
  ~FullDisk();
  FullDisk(const FullDisk&) = delete;
  FullDisk& operator=(const FullDisk&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  // Deletes the filler: the whole tmpfs is free again.
  void MakeRoom() const;

 private:
  std::string directory_;
  bool mounted_ = false;
  std::string why_;
};

// A read-only filesystem at `directory` (made if missing): a tmpfs mounted read-only, as a
// hostPath on a read-only root or a remounted SD card is. MakeWritable() remounts it read-write.
// Unmounted when this object goes. Needs CAP_SYS_ADMIN, like FullDisk.
class ReadOnlyDisk {
 public:
  explicit ReadOnlyDisk(std::string directory);
  ~ReadOnlyDisk();
  ReadOnlyDisk(const ReadOnlyDisk&) = delete;
  ReadOnlyDisk& operator=(const ReadOnlyDisk&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  void MakeWritable() const;

 private:
  std::string directory_;
  bool mounted_ = false;
  std::string why_;
};

// Makes the real kernel announce a device: adds a loop device through /dev/loop-control at an
// index nobody uses and removes it again, which sends "add" and "remove" uevents in the "block"
// subsystem. Returns its name ("loop4711"), or an error saying why not (no CAP_SYS_ADMIN, no
// loop driver): for GTEST_SKIP.
absl::StatusOr<std::string> AnnounceLoopDevice();

// Strings each followed by a NUL, as the kernel writes device-tree strings and uevent messages.
std::string NulTerminated(std::initializer_list<absl::string_view> strings);

// This process at its fd limit: the soft RLIMIT_NOFILE lowered to 4096 and every fd left taken
// (opens of /dev/null), as a daemon is when a node runs out. Give() hands `n` back; the rest,
// and the limit, come back with Restore() or when this object goes.
class AllFdsTaken {
 public:
  AllFdsTaken();
  ~AllFdsTaken() { Restore(); }
  AllFdsTaken(const AllFdsTaken&) = delete;
  AllFdsTaken& operator=(const AllFdsTaken&) = delete;
  void Give(size_t n);
  void Restore();

 private:
  std::vector<int> taken_;
  struct rlimit saved_ = {};
  bool restored_ = false;
};

// What a pod's bind mount of /proc/driver/nvidia becomes when the driver is reloaded: the
// directory it shows was removed. A directory is bind-mounted over `directory` and then deleted
// at its source, so `directory` shows an empty directory with no links. Needs CAP_SYS_ADMIN,
// like FullDisk. Unmounted when this object goes.
class StaleMount {
 public:
  explicit StaleMount(std::string directory);
  ~StaleMount();
  StaleMount(const StaleMount&) = delete;
  StaleMount& operator=(const StaleMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string directory_;
  bool mounted_ = false;
  std::string why_;
};

class FixtureHost {
 public:
  // /proc/sys/kernel/random/boot_id of every fixture host, until a test writes another.
  static constexpr char kBootId[] = "d1b3a6c4-5e2f-4a7b-9c8d-0e1f2a3b4c5d";

  FixtureHost();

  const std::string& root() const { return dir_.path(); }
  // The tree outlives this object (edgeaccel-fixture); the caller removes it.
  void Keep() { dir_.Keep(); }
  // Where a host path lives in the fixture.
  std::string Path(absl::string_view host_path) const;

  // Primitives; parent directories are created as needed. Failures abort the test binary
  // (a fixture that cannot be built makes every assertion meaningless).
  void WriteFile(absl::string_view host_path, absl::string_view content) const;
  void MakeDirectory(absl::string_view host_path) const;
  // Writes `content` over an existing file in place (the same inode, as a program that opens it
  // and writes does, unlike WriteFile) and sets its modification time to `modified`.
  void OverwriteInPlace(absl::string_view host_path, absl::string_view content,
                        struct timespec modified) const;
  // The modification time of the file at `host_path`.
  struct timespec Modified(absl::string_view host_path) const;
  void MakeCharDevice(absl::string_view host_path, unsigned major, unsigned minor,
                      mode_t mode = 0660) const;
  void MakeBlockDevice(absl::string_view host_path, unsigned major, unsigned minor) const;
  void Symlink(absl::string_view target, absl::string_view host_path) const;
  void Remove(absl::string_view host_path) const;  // a file, or a directory tree
  // A character device as device_create makes it: /dev/<dev_name>, and /sys/dev/char/M:m
  // linking to a device whose uevent names it (DEVNAME=<dev_name>).
  void MakeKernelCharDevice(absl::string_view dev_name, unsigned major, unsigned minor,
                            mode_t mode = 0660) const;
  // Adds "<major> <name>" to the character devices in /proc/devices.
  void RegisterCharMajor(unsigned major, absl::string_view name) const;

  // A Coral PCIe/M.2 Edge TPU bound to the apex driver, with driver-default thresholds:
  // sys/devices/pci0000:00/<pci>/{vendor,device,class,numa_node,apex/apex_N/...},
  // sys/class/apex/apex_N -> that, dev/apex_N (char 120:N), proc/modules.
  struct CoralPcie {
    unsigned index = 0;
    std::string pci_address = "0000:03:00.0";
    int numa_node = -1;
    int64_t temp_mc = 45050;  // the driver's encoding: values end in 050/300/550/800
    std::string status = "ALIVE";
  };
  void AddCoralPcie(const CoralPcie& tpu) const;
  // Hot-unplug: the device node goes first (devtmpfs), then the sysfs entries.
  void UnplugCoralPcie(unsigned index, absl::string_view pci_address) const;
  // Writes one attribute of /sys/class/apex/apex_N (e.g. "temp", "status").
  void SetApexAttribute(unsigned index, absl::string_view attribute, absl::string_view value) const;

  // A Coral USB Accelerator on port `port` ("2-1"): sysfs ids, busnum/devnum, and its node
  // /dev/bus/usb/BBB/DDD (char 189:(bus-1)*128+dev-1).
  struct CoralUsb {
    std::string port = "2-1";
    int bus = 2;
    int dev = 2;
    bool firmware_loaded = false;  // 18d1:9302 (ready) instead of 1a6e:089a (DFU)
    std::string speed = "5000";
  };
  void AddCoralUsb(const CoralUsb& usb) const;
  // The firmware loads (or the device is replugged): it re-enumerates with new ids and devnum;
  // the old node goes, a new one appears, the port stays.
  void ReenumerateCoralUsb(const CoralUsb& before, const CoralUsb& after) const;
  // Unplugged: the node goes (devtmpfs), then the interface and device directories in sysfs.
  void UnplugCoralUsb(const CoralUsb& usb) const;

  // Jetson boards as their L4T release exposes them (docs/host-facts.md §3-4).
  // kIgxOrinR36: an Orin module on an IGX board in dGPU mode (add the discrete GPU with
  // AddNvidiaGpu): the iGPU's nodes without its display driver's /dev/nvidia*.
  enum class Jetson { kNanoR32, kXavierNxR35, kAgxOrinR36, kIgxOrinR36 };
  void AddJetson(Jetson board) const;

  // A discrete NVIDIA GPU under the proprietary driver: /proc/driver/nvidia/{version,gpus/<pci>},
  // /dev/nvidia<minor>, the control nodes, PCI sysfs with its NUMA node.
  struct NvidiaGpu {
    std::string pci_address = "0000:01:00.0";
    unsigned minor = 0;
    std::string uuid = "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689";
    std::string model = "NVIDIA L4";
    int numa_node = 0;
  };
  void AddNvidiaGpu(const NvidiaGpu& gpu) const;

  // The driver's user-space files as a driver package installs them: in `directory` (a host
  // path) each library named after the driver's version (libcuda.so.515.76, the version
  // AddNvidiaGpu's kernel module reports), its soname a symlink to it, and /etc/ld.so.cache
  // listing every soname (laid out byte by byte as glibc's ldconfig writes it; this replaces a
  // cache written before); and /usr/bin/nvidia-smi. `content` is each file's bytes.
  struct NvidiaDriverFiles {
    std::string version = "515.76";
    std::string directory = "/usr/lib/x86_64-linux-gnu";
    std::vector<std::string> sonames = {"libcuda.so.1", "libnvidia-ml.so.1",
                                        "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"};
    std::string content = "\x7f" "ELF (a driver library)";
    bool nvidia_smi = true;
    // A driver root the files, their ld.so cache and nvidia-smi are under ("" the host's own;
    // the GPU Operator's is /run/nvidia/driver): the cache names paths inside it.
    std::string root;
  };
  void AddNvidiaDriverFiles(const NvidiaDriverFiles& files) const;

  // NVML: the fake libnvidia-ml.so.1 the tests build (tests/support/fake_nvml.cc) installed at
  // `library` (a host path), with `script` beside it (the fake's format), and an empty events
  // file. Then NvmlScript replaces the script whole (the fake never reads half of one), and
  // NvmlEvent appends an event line ("<uuid> <xid>", "fail <nvmlReturn_t>").
  static constexpr char kNvmlLibrary[] = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
  void AddFakeNvml(const std::string& script, const std::string& library = kNvmlLibrary) const;
  void NvmlScript(const std::string& script, const std::string& library = kNvmlLibrary) const;
  void NvmlEvent(const std::string& line, const std::string& library = kNvmlLibrary) const;
  // The fake library's bytes.
  static std::string FakeNvmlLibrary();

 private:
  TempDir dir_;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_FIXTURE_HOST_H_
