#include "edgeaccel/kubelet/kubelet_api.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace edgeaccel {

std::string SocketFileName(absl::string_view resource_name) {
  return absl::StrCat("edgeaccel-", absl::StrReplaceAll(resource_name, {{"/", "-"}}), ".sock");
}

}  // namespace edgeaccel
