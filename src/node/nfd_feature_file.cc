#include "edgeaccel/node/nfd_feature_file.h"

#include "absl/strings/str_cat.h"
#include "edgeaccel/host/atomic_file.h"

namespace edgeaccel {

absl::Status WriteNfdFeatureFile(const std::string& directory, const LabelSet& labels) {
  std::string content;
  for (const auto& [key, value] : labels) absl::StrAppend(&content, key, "=", value, "\n");
  return WriteFileAtomically(directory, "edgeaccel", content);
}

}  // namespace edgeaccel
