#include "edgeaccel/node/nfd_feature_file.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/host/atomic_file.h"
#include "edgeaccel/node/label_ownership.h"
#include "glog/logging.h"

namespace edgeaccel {

absl::Status WriteNfdFeatureFile(const std::string& directory, const LabelSet& labels) {
  const std::set<std::string> others =
      KeysInOtherFeatureFiles(directory, std::string(kNfdFeatureFileName));
  std::string content;
  std::vector<std::string> left;
  for (const auto& [key, value] : labels) {
    if (others.count(key) > 0) {
      left.push_back(key);
      continue;
    }
    absl::StrAppend(&content, key, "=", value, "\n");
  }
  if (!left.empty()) {
    LOG(INFO) << "NFD feature file: leaving " << absl::StrJoin(left, ", ")
              << " to the other feature file in " << directory << " that defines it";
  }
  return WriteFileAtomically(directory, std::string(kNfdFeatureFileName), content);
}

}  // namespace edgeaccel
