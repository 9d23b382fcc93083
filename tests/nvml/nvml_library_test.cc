// Finding the host's libnvidia-ml.so.1: the ld.so cache that the real ldconfig writes, the
// driver directories (the GPU Operator's /run/nvidia/driver too), symlinks kept inside the root.
#include "edgeaccel/nvml/nvml_library.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "daemon_process.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::RunCommand;
using ::testing::HasSubstr;

std::string FakeLibrary() { return FixtureHost::FakeNvmlLibrary(); }

// The layout of H100 node §5.6 of docs/host-facts.md: the driver's files in a read-only
// /usr/local/nvidia/lib64, the versioned file behind libnvidia-ml.so.1, and links from /lib.
void InstallLikeTheH100Node(const FixtureHost& host) {
  host.WriteFile("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", FakeLibrary());
  host.Symlink("libnvidia-ml.so.580.159.04", "/usr/local/nvidia/lib64/libnvidia-ml.so.1");
  host.Symlink("/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/lib/libnvidia-ml.so.1");
}

// The real ldconfig writes the fixture's /etc/ld.so.cache from its /etc/ld.so.conf.
void RunLdconfig(const FixtureHost& host, const std::string& directories) {
  host.WriteFile("/etc/ld.so.conf", directories);
  CommandResult result = RunCommand("/sbin/ldconfig", {"-r", host.root()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
}

TEST(NvmlLibraryTest, TheCacheTheRealLdconfigWroteNamesTheDriversDirectory) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  RunLdconfig(host, "/usr/local/nvidia/lib64\n");
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->found_by, "/etc/ld.so.cache");
  EXPECT_EQ(library->host_path, "/usr/local/nvidia/lib64/libnvidia-ml.so.1");
  EXPECT_EQ(library->open_path,
            host.root() + "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
}

TEST(NvmlLibraryTest, WithoutACacheTheDriverDirectoriesAreTriedAndAbsoluteLinksStayInTheRoot) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->found_by, "the driver directories");
  EXPECT_EQ(library->host_path, "/lib/libnvidia-ml.so.1");
  // /lib/libnvidia-ml.so.1 -> /usr/local/... is the host's path: resolved under the root.
  EXPECT_EQ(library->open_path,
            host.root() + "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
}

TEST(NvmlLibraryTest, TheGpuOperatorsDriverRootIsLookedIn) {
  FixtureHost host;
  host.WriteFile("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", FakeLibrary());
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
}

TEST(NvmlLibraryTest, ACacheNamingARemovedLibraryFallsBackAndNotFoundSaysWhereItLooked) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  RunLdconfig(host, "/usr/local/nvidia/lib64\n");
  host.Remove("/usr/local/nvidia/lib64");  // the driver uninstalled; the cache is stale
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(absl::IsNotFound(library.status())) << library.status();
  EXPECT_THAT(library.status().message(),
              HasSubstr("/usr/local/nvidia/lib64/libnvidia-ml.so.1 (listed in /etc/ld.so.cache, "
                        "not there)"));
  EXPECT_THAT(library.status().message(),
              HasSubstr("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"));
}

TEST(NvmlLibraryTest, AnUnreadableCacheIsSaidAndTheDirectoriesStillTried) {
  FixtureHost host;
  host.WriteFile("/etc/ld.so.cache", "this is no cache");
  host.WriteFile("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", FakeLibrary());
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  host.Remove("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  library = FindNvmlLibrary(view);
  EXPECT_THAT(library.status().message(),
              HasSubstr("/etc/ld.so.cache (not an ld.so cache in the glibc-ld.so.cache1.1 format)"));
}

// A cache built byte by byte, as glibc's elf/cache.c lays it out, for what ldconfig on this
// machine cannot be made to write: another machine's entries, the old format in front, damage.
class CacheBuilder {
 public:
  void Add(int32_t flags, const std::string& name, const std::string& path) {
    entries_.push_back({flags, name, path});
  }
  std::string New() const {
    std::string strings;
    std::vector<std::pair<uint32_t, uint32_t>> offsets;
    const size_t table = 48 + entries_.size() * 24;
    for (const Entry& e : entries_) {
      const uint32_t key = static_cast<uint32_t>(table + strings.size());
      strings += e.name + '\0';
      const uint32_t value = static_cast<uint32_t>(table + strings.size());
      strings += e.path + '\0';
      offsets.push_back({key, value});
    }
    std::string out = "glibc-ld.so.cache1.1";
    Put32(&out, static_cast<uint32_t>(entries_.size()));
    Put32(&out, static_cast<uint32_t>(strings.size()));
    out.append(4, '\0');   // flags, padding
    out.append(16, '\0');  // extension offset, unused
    for (size_t i = 0; i < entries_.size(); ++i) {
      Put32(&out, static_cast<uint32_t>(entries_[i].flags));
      Put32(&out, offsets[i].first);
      Put32(&out, offsets[i].second);
      out.append(12, '\0');  // osversion, hwcap
    }
    return out + strings;
  }
  // The old table (one dummy entry) in front, as glibc < 2.32 wrote by default.
  std::string OldThenNew() const {
    std::string out = "ld.so-1.7.0";
    out.push_back('\0');
    Put32(&out, 1);
    out.append(12, '\0');
    while (out.size() % 8 != 0) out.push_back('\0');
    return out + New();
  }

 private:
  struct Entry {
    int32_t flags;
    std::string name, path;
  };
  static void Put32(std::string* out, uint32_t v) {
    char bytes[4];
    std::memcpy(bytes, &v, 4);
    out->append(bytes, 4);
  }
  std::vector<Entry> entries_;
};

TEST(NvmlLibraryTest, OnlyThisMachinesEntryIsTaken) {
  CacheBuilder cache;
  cache.Add(0x0003, "libnvidia-ml.so.1", "/usr/lib/i386-linux-gnu/libnvidia-ml.so.1");  // 32-bit
  cache.Add(0x0003 | (NativeLdCacheFlags() == 0x0303 ? 0x0a00 : 0x0300), "libnvidia-ml.so.1",
            "/usr/lib/other-machine/libnvidia-ml.so.1");
  cache.Add(NativeLdCacheFlags(), "libnvidia-ml.so.1", "/opt/driver/lib/libnvidia-ml.so.1");
  FixtureHost host;
  host.WriteFile("/etc/ld.so.cache", cache.OldThenNew());
  for (const char* path : {"/usr/lib/i386-linux-gnu/libnvidia-ml.so.1",
                           "/usr/lib/other-machine/libnvidia-ml.so.1",
                           "/opt/driver/lib/libnvidia-ml.so.1"}) {
    host.WriteFile(path, FakeLibrary());
  }
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/opt/driver/lib/libnvidia-ml.so.1");
  EXPECT_EQ(library->found_by, "/etc/ld.so.cache");
}

TEST(NvmlLibraryTest, DamagedCachesAreErrorsNeverReadsPastTheEnd) {
  CacheBuilder cache;
  cache.Add(NativeLdCacheFlags(), "libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1");
  const std::string good = cache.New();
  ASSERT_TRUE(ParseLdSoCache(good).ok());
  EXPECT_EQ(ParseLdSoCache(good)->at(0).path, "/usr/lib/libnvidia-ml.so.1");
  // Every truncation is refused (or parses to what it still holds), never read past.
  for (size_t size = 0; size < good.size(); ++size) {
    absl::StatusOr<std::vector<LdCacheEntry>> entries = ParseLdSoCache(good.substr(0, size));
    EXPECT_FALSE(entries.ok()) << size;
  }
  std::string huge_count = good;
  huge_count[20] = '\xff';
  huge_count[23] = '\x7f';
  EXPECT_EQ(ParseLdSoCache(huge_count).status().code(), absl::StatusCode::kDataLoss);
  std::string bad_offset = good;
  bad_offset[48 + 4] = '\xff';
  bad_offset[48 + 5] = '\xff';
  EXPECT_EQ(ParseLdSoCache(bad_offset).status().code(), absl::StatusCode::kDataLoss);
  std::string unterminated = good;
  unterminated.back() = 'x';
  EXPECT_EQ(ParseLdSoCache(unterminated).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseLdSoCache("ld.so-1.7.0").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace edgeaccel
