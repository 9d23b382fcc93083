#include "fixture_host.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

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

TempDir::~TempDir() { RemoveTree(path_); }

FixtureHost::FixtureHost() : dir_("edgeaccel-host") {}

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

void FixtureHost::Symlink(absl::string_view target, absl::string_view host_path) const {
  const std::string path = Path(host_path);
  MakeParents(path);
  unlink(path.c_str());
  PCHECK(symlink(std::string(target).c_str(), path.c_str()) == 0) << "symlink " << path;
}

void FixtureHost::Remove(absl::string_view host_path) const { RemoveTree(Path(host_path)); }

void FixtureHost::AddCoralPcie(const CoralPcie& tpu) const {
  const std::string name = absl::StrCat("apex_", tpu.index);
  const std::string pci = absl::StrCat("/sys/devices/pci0000:00/", tpu.pci_address);
  WriteFile(pci + "/vendor", "0x1ac1\n");
  WriteFile(pci + "/device", "0x089a\n");
  WriteFile(pci + "/class", "0x0880ff\n");
  WriteFile(pci + "/numa_node", absl::StrCat(tpu.numa_node, "\n"));
  const std::string sys = absl::StrCat(pci, "/apex/", name);
  // Gasket's generic attributes, then apex's (FACTS.md 1.5); thresholds read back as the
  // driver encodes them.
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

}  // namespace edgeaccel::testing
