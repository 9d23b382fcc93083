// One policy for every label sink: never write a label key that another writer holds.
//
// GPU feature discovery (GFD) writes nvidia.com/gpu.* for the same GPUs, NFD copies feature files
// onto the node, an operator may pin a label by hand. Two writers of one key overwrite each
// other for ever, and which value a selector sees depends on who wrote last. So a key that
// someone else holds is left to them, and ours are only the keys nobody else has.
#ifndef EDGEACCEL_NODE_LABEL_OWNERSHIP_H_
#define EDGEACCEL_NODE_LABEL_OWNERSHIP_H_

#include <set>
#include <string>

#include "edgeaccel/node/node_labels.h"

namespace edgeaccel {

// The keys of `want` that another writer holds on the Node: there in `node_labels` and either
// not among `ours` (the keys we set, from our annotation) or changed since we set them (`applied`
// holds the values we last wrote; a key missing from it is taken as unchanged).
std::set<std::string> KeysHeldByOthers(const LabelSet& want, const LabelSet& node_labels,
                                       const std::set<std::string>& ours, const LabelSet& applied);

// The label keys that NFD feature files other than `own_file` in `directory` (features.d/)
// define: NFD reads every file there, and for a key defined twice the file later by name wins.
// Lines are "key=value" or a bare "key"; "#" starts a comment or directive. Dot-files, files
// that are not regular and files over NFD's 64 KiB limit are skipped, as NFD skips them.
std::set<std::string> KeysInOtherFeatureFiles(const std::string& directory,
                                              const std::string& own_file);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_LABEL_OWNERSHIP_H_
