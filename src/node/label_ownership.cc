#include "edgeaccel/node/label_ownership.h"

#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace edgeaccel {
namespace {

constexpr off_t kNfdMaxFeatureFileSize = 64 * 1024;

}  // namespace

std::set<std::string> KeysHeldByOthers(const LabelSet& want, const LabelSet& node_labels,
                                       const std::set<std::string>& ours, const LabelSet& applied) {
  std::set<std::string> held;
  for (const auto& [key, value] : want) {
    auto on_node = node_labels.find(key);
    if (on_node == node_labels.end()) continue;
    if (ours.count(key) == 0) {
      held.insert(key);
      continue;
    }
    auto written = applied.find(key);
    if (written != applied.end() && written->second != on_node->second) held.insert(key);
  }
  return held;
}

std::set<std::string> KeysInOtherFeatureFiles(const std::string& directory,
                                              const std::string& own_file) {
  std::set<std::string> keys;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return keys;
  while (struct dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || name == own_file) continue;
    const std::string path = absl::StrCat(directory, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kNfdMaxFeatureFileSize) {
      continue;
    }
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (text.empty() || text[0] == '#') continue;
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(text, absl::MaxSplits('=', 1));
      absl::string_view key = absl::StripAsciiWhitespace(kv.first);
      // "-key" deletes a label in NFD's format: it holds no value, but it is that file's word.
      if (!key.empty()) keys.insert(std::string(key));
    }
  }
  closedir(dir);
  return keys;
}

}  // namespace edgeaccel
