// The host's ld.so cache: what the real ldconfig writes, another machine's entries, damage.
#include "edgeaccel/host/ld_so_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "daemon_process.h"
#include "fixture_host.h"
#include "ld_so_cache_builder.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::LdSoCacheBuilder;
using ::edgeaccel::testing::RunCommand;
using ::testing::HasSubstr;

TEST(LdSoCacheTest, TheCacheTheRealLdconfigWroteListsEachLibraryBySoname) {
  FixtureHost host;
  // ldconfig names the entry by the soname in the ELF file (the fake NVML's is
  // libnvidia-ml.so.1), whatever the file is called, and makes that link.
  host.WriteFile("/opt/driver/lib/libnvidia-ml.so.580.159.04", FixtureHost::FakeNvmlLibrary());
  host.WriteFile("/etc/ld.so.conf", "/opt/driver/lib\n");
  CommandResult result = RunCommand("/sbin/ldconfig", {"-r", host.root()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  Host view(host.root());
  absl::StatusOr<std::vector<LdCacheEntry>> entries = ReadLdSoCache(view);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ(entries->at(0).name, "libnvidia-ml.so.1");
  EXPECT_EQ(entries->at(0).path, "/opt/driver/lib/libnvidia-ml.so.1");
  EXPECT_TRUE(IsNativeLdCacheEntry(entries->at(0)));
}

TEST(LdSoCacheTest, AMissingOrForeignCacheIsAnErrorNamingTheFile) {
  FixtureHost host;
  Host view(host.root());
  absl::StatusOr<std::vector<LdCacheEntry>> entries = ReadLdSoCache(view);
  EXPECT_TRUE(absl::IsNotFound(entries.status())) << entries.status();
  EXPECT_THAT(entries.status().message(), HasSubstr("/etc/ld.so.cache: "));
  host.WriteFile("/etc/ld.so.cache", "this is no cache");
  entries = ReadLdSoCache(view);
  EXPECT_EQ(entries.status().message(),
            "/etc/ld.so.cache: not an ld.so cache in the glibc-ld.so.cache1.1 format");
}

TEST(LdSoCacheTest, OnlyThisMachinesEntriesAreNative) {
  const int32_t other_machine = 0x0003 | (NativeLdCacheFlags() == 0x0303 ? 0x0a00 : 0x0300);
  EXPECT_FALSE(IsNativeLdCacheEntry({"libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003}));
  EXPECT_FALSE(IsNativeLdCacheEntry({"libcuda.so.1", "/usr/lib/other/libcuda.so.1", other_machine}));
  EXPECT_TRUE(IsNativeLdCacheEntry({"libcuda.so.1", "/usr/lib/libcuda.so.1", NativeLdCacheFlags()}));
}

TEST(LdSoCacheTest, TheOldTableInFrontIsSkipped) {
  LdSoCacheBuilder cache;
  cache.Add(NativeLdCacheFlags(), "libcuda.so.1", "/usr/lib/libcuda.so.1");
  absl::StatusOr<std::vector<LdCacheEntry>> entries = ParseLdSoCache(cache.OldThenNew());
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ(entries->at(0).path, "/usr/lib/libcuda.so.1");
}

TEST(LdSoCacheTest, DamagedCachesAreErrorsNeverReadsPastTheEnd) {
  LdSoCacheBuilder cache;
  cache.Add(NativeLdCacheFlags(), "libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1");
  const std::string good = cache.New();
  ASSERT_TRUE(ParseLdSoCache(good).ok());
  EXPECT_EQ(ParseLdSoCache(good)->at(0).path, "/usr/lib/libnvidia-ml.so.1");
  // Every truncation is refused, never read past.
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
