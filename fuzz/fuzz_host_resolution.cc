// Host path resolution against fuzzed trees of directories, files and symlinks: whatever the
// links say, nothing resolves outside the root, and the walk (kernels before 5.6) agrees with
// the kernel's openat2 RESOLVE_IN_ROOT on what a path names.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "edgeaccel/host/host.h"

namespace {

// Names from a small alphabet, so that paths and link targets meet often.
std::string Component(FuzzedDataProvider& input) {
  static const char* const kNames[] = {"a", "b", "sys", "dev", "..", ".", ""};
  return kNames[input.ConsumeIntegralInRange<size_t>(0, std::size(kNames) - 1)];
}

std::string PathOf(FuzzedDataProvider& input, bool absolute) {
  std::string path = absolute ? "/" : "";
  const size_t parts = input.ConsumeIntegralInRange<size_t>(0, 5);
  for (size_t i = 0; i < parts; ++i) {
    if (i > 0) path += "/";
    path += Component(input);
  }
  return path;
}

int Remove(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

// Where the file `fd` is, as the kernel says.
std::string WhereIs(int fd) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  char templ[] = "/tmp/edgeaccel-fuzz-resolve-XXXXXX";
  if (mkdtemp(templ) == nullptr) return 0;
  const std::string root = templ;
  // The tree: a few directories, files and links, each at a fuzzed place.
  const size_t entries = input.ConsumeIntegralInRange<size_t>(0, 12);
  for (size_t i = 0; i < entries; ++i) {
    const std::string where = root + PathOf(input, true);
    switch (input.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        mkdir(where.c_str(), 0755);
        break;
      case 1: {
        int fd = open(where.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
        break;
      }
      default:
        (void)!symlink(PathOf(input, input.ConsumeBool()).c_str(), where.c_str());
        break;
    }
  }
  const std::string host_path = PathOf(input, true);

  edgeaccel::Host kernel(root, edgeaccel::Host::Resolution::kKernel);
  edgeaccel::Host walk(root, edgeaccel::Host::Resolution::kWalk);
  const std::string resolved = walk.Resolve(host_path);
  if (resolved != root && resolved.rfind(root + "/", 0) != 0) __builtin_trap();
  for (int flags : {O_PATH, O_PATH | O_NOFOLLOW, O_RDONLY | O_NONBLOCK}) {
    absl::StatusOr<int> by_kernel = kernel.Open(host_path, flags);
    absl::StatusOr<int> by_walk = walk.Open(host_path, flags);
    for (const absl::StatusOr<int>* opened : {&by_kernel, &by_walk}) {
      if (!opened->ok()) continue;
      const std::string where = WhereIs(**opened);
      if (where != root && where.rfind(root + "/", 0) != 0) __builtin_trap();  // escaped
    }
    if (by_kernel.ok() != by_walk.ok()) {  // the two disagree on what exists
      fprintf(stderr, "path %s flags %x: kernel %s, walk %s\n", host_path.c_str(), flags,
              by_kernel.status().ToString().c_str(), by_walk.status().ToString().c_str());
      system(("ls -laR " + root + " >&2").c_str());
      __builtin_trap();
    }
    if (by_kernel.ok()) {
      struct stat a, b;
      if (fstat(*by_kernel, &a) != 0 || fstat(*by_walk, &b) != 0 || a.st_ino != b.st_ino ||
          a.st_dev != b.st_dev) {
        __builtin_trap();  // ... or on which file a path names
      }
      close(*by_kernel);
      close(*by_walk);
    }
  }
  nftw(root.c_str(), Remove, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}
