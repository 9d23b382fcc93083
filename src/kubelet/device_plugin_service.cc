#include "edgeaccel/kubelet/device_plugin_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// The devices the kubelet may hear of now: every device, or those advertise_now allows.
std::vector<const Device*> Advertisable(const PluginOptions& options, const Snapshot& snapshot) {
  std::vector<const Device*> devices;
  for (const Device& device : snapshot.devices) {
    if (!options.advertise_now || options.advertise_now(device)) devices.push_back(&device);
  }
  return devices;
}

using ListAndWatchStreams = SnapshotStreams<v1beta1::Empty, v1beta1::ListAndWatchResponse>;

// The list: the advertisable devices, with their health and NUMA node; the same version again
// when what advertise_now allows changed (a held device became advertisable, or the other way).
ListAndWatchStreams::Messages ListAndWatchMessages(const PluginOptions* options) {
  ListAndWatchStreams::Messages messages;
  messages.build = [options](const Snapshot& snapshot, v1beta1::ListAndWatchResponse* out) {
    for (const Device* device_ptr : Advertisable(*options, snapshot)) {
      const Device& device = *device_ptr;
      v1beta1::Device* entry = out->add_devices();
      entry->set_id(device.id);
      entry->set_health(std::string(HealthName(device.health)));
      if (device.numa_node.has_value()) entry->mutable_topology()->add_nodes()->set_id(*device.numa_node);
    }
  };
  messages.resend = [options](const Snapshot& latest, const v1beta1::ListAndWatchResponse& sent) {
    return Advertisable(*options, latest).size() != static_cast<size_t>(sent.devices_size());
  };
  return messages;
}

// Silence() pauses every stream; the counters count streams and messages; a stream the kubelet
// cancels is logged and reported to `on_stream_cancelled`.
SnapshotStreamsBase::Hooks ListAndWatchHooks(const std::atomic<bool>* silenced, PluginCounters* counters,
                                             std::string name, std::function<void()> on_stream_cancelled) {
  SnapshotStreamsBase::Hooks hooks;
  hooks.paused = [silenced] { return silenced->load(); };
  hooks.written = [counters] { counters->list_and_watch_updates.fetch_add(1); };
  hooks.opened = [counters, name](bool serving) {
    counters->streams_opened.fetch_add(1);
    if (serving) LOG(INFO) << name << ": ListAndWatch stream opened";
  };
  hooks.ended = [name, on_stream_cancelled = std::move(on_stream_cancelled)](bool cancelled) {
    if (!cancelled) return;
    VLOG(1) << name << ": ListAndWatch stream cancelled by the client";
    if (on_stream_cancelled) on_stream_cancelled();
  };
  return hooks;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Service

DevicePluginService::DevicePluginService(DeviceSet* set, PluginCounters* counters,
                                         PluginOptions options,
                                         std::function<void()> on_stream_cancelled)
    : set_(set),
      counters_(counters),
      options_(std::move(options)),
      streams_(set, absl::StrCat(set->resource_name(), ": ListAndWatch"),
               ListAndWatchMessages(&options_),
               ListAndWatchHooks(&silenced_, counters, set->resource_name(),
                                 std::move(on_stream_cancelled))) {}

DevicePluginService::~DevicePluginService() = default;

grpc::Status DevicePluginService::GetDevicePluginOptions(const v1beta1::Empty&,
                                                         v1beta1::DevicePluginOptions* response) {
  *response = AdvertisedOptions(options_);
  return grpc::Status::OK;
}

void DevicePluginService::Serve(v1beta1::DevicePlugin::AsyncService* service,
                                CompletionLoop* loop) {
  grpc::ServerCompletionQueue* cq = loop->cq();
  using v1beta1::DevicePlugin;
  UnaryMethod<v1beta1::Empty, v1beta1::DevicePluginOptions>::Serve(
      loop, [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestGetDevicePluginOptions(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return GetDevicePluginOptions(request, response); });
  UnaryMethod<v1beta1::PreferredAllocationRequest, v1beta1::PreferredAllocationResponse>::Serve(
      loop, [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestGetPreferredAllocation(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return GetPreferredAllocation(request, response); });
  UnaryMethod<v1beta1::AllocateRequest, v1beta1::AllocateResponse>::Serve(
      loop, [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestAllocate(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return Allocate(request, response); });
  UnaryMethod<v1beta1::PreStartContainerRequest, v1beta1::PreStartContainerResponse>::Serve(
      loop, [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestPreStartContainer(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return PreStartContainer(request, response); });
  streams_.Serve(loop, [service, cq](auto* context, auto* request, auto* writer, void* tag) {
    service->RequestListAndWatch(context, request, writer, cq, cq, tag);
  });
}

grpc::Status DevicePluginService::GetPreferredAllocation(
    const v1beta1::PreferredAllocationRequest& request,
    v1beta1::PreferredAllocationResponse* response) {
  if (!options_.preferred_allocation) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "GetPreferredAllocation is not offered by this plugin");
  }
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  for (const auto& container : request.container_requests()) {
    auto* out = response->add_container_responses();
    for (std::string& id : options_.preferred_allocation(*snapshot, container)) {
      out->add_deviceids(std::move(id));
    }
  }
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::Allocate(const v1beta1::AllocateRequest& request,
                                           v1beta1::AllocateResponse* response) {
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  absl::Status status;
  if (request.container_requests_size() == 0) {
    status = absl::InvalidArgumentError("Allocate request has no container");
  }
  std::string cdi_fallback;
  for (const auto& container : request.container_requests()) {
    status = BuildContainerAllocation(*snapshot, set_->resource_name(), container,
                                      options_.cdi_device_name,
                                      response->add_container_responses(), &cdi_fallback);
    if (!status.ok()) break;
  }
  if (status.ok() && !cdi_fallback.empty()) {
    LOG(WARNING) << set_->resource_name()
                 << ": Allocate answers device nodes without CDI names: " << cdi_fallback;
  }
  if (status.ok()) {
    counters_->allocations.fetch_add(1);
    if (VLOG_IS_ON(1)) {
      std::vector<std::string> containers;
      for (const auto& container : request.container_requests()) {
        containers.push_back(absl::StrCat("[", absl::StrJoin(container.devices_ids(), " "), "]"));
      }
      VLOG(1) << set_->resource_name() << ": allocated " << absl::StrJoin(containers, " ");
    }
  } else {
    counters_->allocate_errors.fetch_add(1);
    response->Clear();
    LOG(WARNING) << set_->resource_name() << ": Allocate refused: " << status.message();
  }
  return ToGrpc(status);
}

grpc::Status DevicePluginService::PreStartContainer(
    const v1beta1::PreStartContainerRequest& request, v1beta1::PreStartContainerResponse*) {
  // The kubelet calls this only when the options say pre_start_required, that is when a
  // pre-start hook is set; without one there is nothing to prepare.
  absl::Status status;
  if (options_.pre_start) {
    std::vector<std::string> ids(request.devices_ids().begin(), request.devices_ids().end());
    status = options_.pre_start(*set_->Current(), ids);
    if (!status.ok()) {
      LOG(WARNING) << set_->resource_name() << ": PreStartContainer refused: " << status.message();
    }
  }
  return ToGrpc(status);
}

}  // namespace edgeaccel
