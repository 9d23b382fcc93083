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

}  // namespace

class DevicePluginService::Stream final
    : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
 public:
  explicit Stream(DevicePluginService* service) : service_(service) {}

  void Begin(const std::shared_ptr<Stream>& self) {
    std::weak_ptr<Stream> weak = self;
    listener_id_ = service_->set_->Subscribe([weak](std::shared_ptr<const Snapshot> snapshot) {
      if (std::shared_ptr<Stream> stream = weak.lock()) stream->Deliver(std::move(snapshot));
    });
    Deliver(service_->set_->Current());
  }

  // A new device list: send it now, or as soon as the write in flight completes.
  void Deliver(std::shared_ptr<const Snapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!latest_ || snapshot->version > latest_->version) latest_ = std::move(snapshot);
      if (writing_ || !NeedsWriteLocked()) return;
      PrepareWriteLocked();
    }
    StartWrite(&response_);
  }

  // What advertise_now allows may have changed: send the list again if it differs.
  void Redeliver() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ || !NeedsWriteLocked()) return;
      PrepareWriteLocked();
    }
    StartWrite(&response_);
  }

  // Ends the stream with OK (daemon shutdown or server restart).
  void End() { FinishOnce(grpc::Status::OK); }

  void OnWriteDone(bool ok) override {
    bool write_next = false;
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) service_->counters_->list_and_watch_updates.fetch_add(1);
      if (!ok) {
        finish = !finished_ || end_pending_;
        finished_ = true;
        finish_with = grpc::Status(grpc::StatusCode::CANCELLED, "ListAndWatch stream broken");
      } else if (end_pending_) {
        finish = true;
        finish_with = end_status_;
      } else if (!finished_ && NeedsWriteLocked()) {
        PrepareWriteLocked();
        write_next = true;
      }
      if (finish) end_pending_ = false;
    }
    if (write_next) StartWrite(&response_);
    if (finish) Finish(finish_with);
  }

  void OnCancel() override {
    VLOG(1) << service_->set_->resource_name() << ": ListAndWatch stream cancelled by the client";
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    if (service_->on_stream_cancelled_) service_->on_stream_cancelled_();
  }

  void OnDone() override {
    service_->set_->Unsubscribe(listener_id_);
    service_->Forget(this);  // may destroy this object: nothing may follow
  }

 private:
  // The ids the kubelet may hear of now: every device, or those advertise_now allows.
  std::vector<const Device*> AdvertisableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<const Device*> devices;
    for (const Device& device : latest_->devices) {
      if (!service_->options_.advertise_now || service_->options_.advertise_now(device)) {
        devices.push_back(&device);
      }
    }
    return devices;
  }

  bool NeedsWriteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!latest_) return false;
    if (!sent_any_ || latest_->version != sent_version_) return true;
    return AdvertisableLocked().size() != sent_count_;  // held devices became advertisable
  }

  void PrepareWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    sent_any_ = true;
    sent_version_ = latest_->version;
    response_.Clear();
    const std::vector<const Device*> advertisable = AdvertisableLocked();
    sent_count_ = advertisable.size();
    for (const Device* device_ptr : advertisable) {
      const Device& device = *device_ptr;
      v1beta1::Device* out = response_.add_devices();
      out->set_id(device.id);
      out->set_health(std::string(HealthName(device.health)));
      if (device.numa_node.has_value()) out->mutable_topology()->add_nodes()->set_id(*device.numa_node);
    }
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (writing_) {
        // Finish after the write in flight completes (OnWriteDone).
        end_pending_ = true;
        end_status_ = status;
        return;
      }
    }
    Finish(status);
  }

  DevicePluginService* const service_;
  uint64_t listener_id_ = 0;
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  size_t sent_count_ ABSL_GUARDED_BY(mu_) = 0;  // devices in that message
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  v1beta1::ListAndWatchResponse response_;  // owned by gRPC while a write is in flight
};

// ---------------------------------------------------------------------------------------------
// Service

DevicePluginService::DevicePluginService(DeviceSet* set, PluginCounters* counters,
                                         PluginOptions options,
                                         std::function<void()> on_stream_cancelled)
    : set_(set),
      counters_(counters),
      options_(std::move(options)),
      on_stream_cancelled_(std::move(on_stream_cancelled)) {}

int DevicePluginService::OpenStreams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

DevicePluginService::~DevicePluginService() {
  absl::MutexLock lock(&mu_);
  LOG_IF(DFATAL, !streams_.empty()) << "DevicePluginService destroyed with open streams";
}

void DevicePluginService::EndStreams() {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    for (const auto& [ptr, stream] : streams_) open.push_back(stream);
  }
  for (const auto& stream : open) stream->End();
}

void DevicePluginService::Readvertise() {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, stream] : streams_) open.push_back(stream);
  }
  for (const auto& stream : open) stream->Redeliver();
}

void DevicePluginService::Forget(Stream* stream) {
  std::shared_ptr<Stream> last;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  last = std::move(it->second);
  streams_.erase(it);
}

grpc::ServerUnaryReactor* DevicePluginService::GetDevicePluginOptions(
    grpc::CallbackServerContext* context, const v1beta1::Empty*,
    v1beta1::DevicePluginOptions* response) {
  *response = AdvertisedOptions(options_);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* DevicePluginService::ListAndWatch(
    grpc::CallbackServerContext*, const v1beta1::Empty*) {
  auto stream = std::make_shared<Stream>(this);
  bool ended;
  {
    // Every stream is kept alive by this map until its OnDone.
    absl::MutexLock lock(&mu_);
    ended = ended_;
    streams_[stream.get()] = stream;
  }
  counters_->streams_opened.fetch_add(1);
  if (ended) {
    stream->End();  // shutting down: answer at once, with no devices
  } else {
    LOG(INFO) << set_->resource_name() << ": ListAndWatch stream opened";
    stream->Begin(stream);
  }
  return stream.get();
}

grpc::ServerUnaryReactor* DevicePluginService::GetPreferredAllocation(
    grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!options_.preferred_allocation) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "GetPreferredAllocation is not offered by this plugin"));
    return reactor;
  }
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  for (const auto& container : request->container_requests()) {
    auto* out = response->add_container_responses();
    for (std::string& id : options_.preferred_allocation(*snapshot, container)) {
      out->add_deviceids(std::move(id));
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::Allocate(grpc::CallbackServerContext* context,
                                                        const v1beta1::AllocateRequest* request,
                                                        v1beta1::AllocateResponse* response) {
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  absl::Status status;
  if (request->container_requests_size() == 0) {
    status = absl::InvalidArgumentError("Allocate request has no container");
  }
  std::string cdi_fallback;
  for (const auto& container : request->container_requests()) {
    status = BuildContainerAllocation(*snapshot, set_->resource_name(), container,
                                      options_.cdi_device_name,
                                      response->add_container_responses(), &cdi_fallback);
    if (!status.ok()) break;
  }
  if (status.ok() && !cdi_fallback.empty()) {
    LOG(WARNING) << set_->resource_name()
                 << ": Allocate answers device nodes without CDI names: " << cdi_fallback;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok()) {
    counters_->allocations.fetch_add(1);
    if (VLOG_IS_ON(1)) {
      std::vector<std::string> containers;
      for (const auto& container : request->container_requests()) {
        containers.push_back(absl::StrCat("[", absl::StrJoin(container.devices_ids(), " "), "]"));
      }
      VLOG(1) << set_->resource_name() << ": allocated " << absl::StrJoin(containers, " ");
    }
  } else {
    counters_->allocate_errors.fetch_add(1);
    response->Clear();
    LOG(WARNING) << set_->resource_name() << ": Allocate refused: " << status.message();
  }
  reactor->Finish(ToGrpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* DevicePluginService::PreStartContainer(
    grpc::CallbackServerContext* context, const v1beta1::PreStartContainerRequest* request,
    v1beta1::PreStartContainerResponse*) {
  // The kubelet calls this only when the options say pre_start_required, that is when a
  // pre-start hook is set; without one there is nothing to prepare.
  absl::Status status;
  if (options_.pre_start) {
    std::vector<std::string> ids(request->devices_ids().begin(), request->devices_ids().end());
    status = options_.pre_start(*set_->Current(), ids);
    if (!status.ok()) {
      LOG(WARNING) << set_->resource_name() << ": PreStartContainer refused: " << status.message();
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

}  // namespace edgeaccel
