// An ld.so cache built byte by byte, as glibc's elf/cache.c lays it out, for what ldconfig on
// this machine cannot be made to write: another machine's entries, the old format in front,
// damage. Where the real ldconfig can write the cache, tests use it (ldconfig -r <fixture>).
#ifndef EDGEACCEL_TESTS_SUPPORT_LD_SO_CACHE_BUILDER_H_
#define EDGEACCEL_TESTS_SUPPORT_LD_SO_CACHE_BUILDER_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace edgeaccel::testing {

class LdSoCacheBuilder {
 public:
  void Add(int32_t flags, const std::string& name, const std::string& path) {
    entries_.push_back({flags, name, path});
  }
  // The glibc-ld.so.cache1.1 format alone, as glibc >= 2.32 writes it.
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

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_LD_SO_CACHE_BUILDER_H_
