#include "edgeaccel/kubelet/kubelet_holdings.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "podresources_v1.grpc.pb.h"

namespace edgeaccel {
namespace {

absl::Status CallFailed(const char* call, const std::string& socket, const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("pod-resources ", call, " on ", socket, ": ",
                                   status.error_message()));
}

}  // namespace

absl::StatusOr<KubeletHoldings> AskPodResources(const std::string& socket,
                                                absl::Duration timeout) {
  if (!UnixSocketAnswers(socket)) {
    return absl::UnavailableError(absl::StrCat("nothing answers on ", socket));
  }
  auto stub = v1::PodResourcesLister::NewStub(DialUnixSocket(socket));
  KubeletHoldings holdings;
  holdings.source = "pod-resources";
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    v1::AllocatableResourcesResponse response;
    grpc::Status status =
        stub->GetAllocatableResources(&context, v1::AllocatableResourcesRequest(), &response);
    if (!status.ok()) return CallFailed("GetAllocatableResources", socket, status);
    for (const v1::ContainerDevices& devices : response.devices()) {
      std::vector<std::string>& ids = holdings.healthy[devices.resource_name()];
      ids.insert(ids.end(), devices.device_ids().begin(), devices.device_ids().end());
      holdings.known.insert(devices.resource_name());
    }
  }
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    v1::ListPodResourcesResponse response;
    grpc::Status status = stub->List(&context, v1::ListPodResourcesRequest(), &response);
    if (!status.ok()) return CallFailed("List", socket, status);
    for (const v1::PodResources& pod : response.pod_resources()) {
      for (const v1::ContainerResources& container : pod.containers()) {
        for (const v1::ContainerDevices& devices : container.devices()) {
          std::vector<std::string>& ids = holdings.allocated[devices.resource_name()];
          ids.insert(ids.end(), devices.device_ids().begin(), devices.device_ids().end());
          holdings.known.insert(devices.resource_name());
          for (const std::string& id : devices.device_ids()) {
            holdings.holders[devices.resource_name()][id] = {pod.namespace_(), pod.name()};
          }
        }
        for (const v1::DynamicResource& claim : container.dynamic_resources()) {
          for (const v1::ClaimResource& resource : claim.claim_resources()) {
            holdings.claims_in_use[resource.driver_name()].insert(
                absl::StrCat(claim.claim_namespace(), "/", claim.claim_name()));
          }
        }
      }
    }
  }
  return holdings;
}

KubeletHoldings HoldingsFromCheckpoint(const KubeletCheckpoint& checkpoint) {
  KubeletHoldings holdings;
  holdings.source = "checkpoint";
  for (const auto& [resource, ids] : checkpoint.registered_devices) {
    holdings.healthy[resource] = ids;
    holdings.known.insert(resource);
  }
  for (const KubeletCheckpoint::Entry& entry : checkpoint.entries) {
    std::vector<std::string>& ids = holdings.allocated[entry.resource_name];
    ids.insert(ids.end(), entry.device_ids.begin(), entry.device_ids.end());
    holdings.known.insert(entry.resource_name);
    for (const std::string& id : entry.device_ids) {
      holdings.holders[entry.resource_name][id] = {"", entry.pod_uid};
    }
  }
  return holdings;
}

}  // namespace edgeaccel
