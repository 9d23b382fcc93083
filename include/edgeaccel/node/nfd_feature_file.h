#ifndef EDGEACCEL_NODE_NFD_FEATURE_FILE_H_
#define EDGEACCEL_NODE_NFD_FEATURE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/node/node_labels.h"

namespace edgeaccel {

inline constexpr absl::string_view kNfdFeatureFileName = "edgeaccel";

// Node Feature Discovery's local source: writes `labels` as "name=value" lines to
// <directory>/edgeaccel, atomically (a dot-file, then rename), so NFD never reads half a file;
// mode 0644, since NFD's worker reads it as another user. A key another feature file there
// defines (GFD's "gfd", say) is left out and left to that file (label_ownership.h).
absl::Status WriteNfdFeatureFile(const std::string& directory, const LabelSet& labels);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NFD_FEATURE_FILE_H_
