// Node labels: what the node's accelerators are, for nodeSelectors and affinity.
//
// NVIDIA GPUs use the names GPU feature discovery uses (nvidia.com/gpu.present, .count,
// .product, .memory, .family, .compute.major/.minor, .replicas, nvidia.com/cuda.driver.*,
// nvidia.com/cuda.runtime.*, nvidia.com/mig.capable), so existing selectors keep working; where
// a node's discrete GPUs differ, each product also gets nvidia.com/gpu-<product>.count, .memory,
// .compute.major/.minor and .family (the per-node ones describe the first GPU, as GFD's do).
// Facts GFD has no label for use names of ours: nvidia.com/gpu.ecc (enabled|disabled) and
// nvidia.com/mig.mode (enabled|disabled|mixed); Jetson adds nvidia.com/jetson.*; Edge TPUs get
// coral.ai/edgetpu.*. Values are sanitised to valid label values.
#ifndef EDGEACCEL_NODE_NODE_LABELS_H_
#define EDGEACCEL_NODE_NODE_LABELS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

using LabelSet = std::map<std::string, std::string>;

struct LabelOptions {
  // Also the seed system's plain labels (gpu.model, gpu.driver, gpu.resource, gpu.vendor.id,
  // gpu.product.id): gpu.model holds the model and gpu.driver the driver.
  bool seed_labels = false;
  // The facts of every discrete GPU NVML lists, those not advertised (MIG mode on) too: for
  // nvidia.com/mig.capable and nvidia.com/mig.mode.
  std::vector<std::map<std::string, std::string>> nvml_gpus;
};

// A valid label value: at most 63 characters of [A-Za-z0-9._-], starting and ending
// alphanumeric; anything else becomes '-'. May be empty.
std::string SanitizeLabelValue(absl::string_view value);

// The labels for the devices in `snapshots` (resource name -> its current devices).
LabelSet DeriveLabels(const std::map<std::string, std::shared_ptr<const Snapshot>>& snapshots,
                      const LabelOptions& options);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NODE_LABELS_H_
