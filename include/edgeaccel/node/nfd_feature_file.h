#ifndef EDGEACCEL_NODE_NFD_FEATURE_FILE_H_
#define EDGEACCEL_NODE_NFD_FEATURE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "edgeaccel/node/node_labels.h"

namespace edgeaccel {

// Node Feature Discovery's local source: writes `labels` as "name=value" lines to
// <directory>/edgeaccel, atomically (a dot-file, then rename), so NFD never reads half a file.
absl::Status WriteNfdFeatureFile(const std::string& directory, const LabelSet& labels);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NFD_FEATURE_FILE_H_
