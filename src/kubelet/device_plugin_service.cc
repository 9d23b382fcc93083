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

class DevicePluginService::Stream {
 public:
  explicit Stream(DevicePluginService* service)
      : service_(service),
        writer_(&context_),
        arrived_(this, &Stream::OnArrived),
        written_(this, &Stream::OnWriteDone),
        finished_call_(this, &Stream::OnFinishDone),
        done_(this, &Stream::OnCallDone),
        woken_(this, &Stream::OnWoken) {}

  // Waits for the next ListAndWatch call on the service's queue.
  void Wait() {
    context_.AsyncNotifyWhenDone(&done_);  // before the request: it must cover the whole call
    grpc::ServerCompletionQueue* cq = service_->loop_->cq();
    service_->async_service_->RequestListAndWatch(&context_, &request_, &writer_, cq, cq,
                                                  &arrived_);
  }

  // On the loop thread, when the call arrives.
  void Begin() {
    listener_id_ = service_->set_->Subscribe(
        [gate = gate_](std::shared_ptr<const Snapshot> snapshot) {
          absl::MutexLock lock(&gate->mu);
          if (gate->stream != nullptr) gate->stream->Deliver(std::move(snapshot));
        });
    Deliver(service_->set_->Current());
  }

  // A new device list, from any thread (the DeviceSet's listeners run on the thread that updated
  // it): kept, and sent from the loop thread as soon as no write is in flight.
  void Deliver(std::shared_ptr<const Snapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!latest_ || snapshot->version > latest_->version) latest_ = std::move(snapshot);
    }
    Pump();
  }

  // What advertise_now allows may have changed: send the list again if it differs. Any thread.
  void Redeliver() { Pump(); }

  // Ends the stream with OK (daemon shutdown or server restart). Any thread.
  void End() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      end_pending_ = true;  // Finish once no write is in flight
    }
    Pump();
  }

 private:
  // What the DeviceSet listener reaches the stream through. A listener may still be running
  // when Unsubscribe returns (it runs on the thread that updated the set); had it held the
  // stream itself (a weak_ptr locked for the call), the stream could outlive Forget and reach
  // a service that PluginServer::Stop has already destroyed. The gate is closed before the
  // stream is forgotten, and closing it waits for a delivery in progress.
  struct Gate {
    absl::Mutex mu;
    Stream* stream ABSL_GUARDED_BY(mu);
  };

  // One kind of event of this call, as the loop delivers it.
  class Event final : public CompletionTag {
   public:
    Event(Stream* stream, void (Stream::*handler)(bool)) : stream_(stream), handler_(handler) {}
    void Proceed(bool ok) override { (stream_->*handler_)(ok); }

   private:
    Stream* const stream_;
    void (Stream::*const handler_)(bool);
  };

  static std::shared_ptr<Gate> MakeGate(Stream* stream) {
    auto gate = std::make_shared<Gate>();
    absl::MutexLock lock(&gate->mu);
    gate->stream = stream;
    return gate;
  }

  enum class Next { kNothing, kWrite, kFinish };

  // What the stream does next, decided under mu_; the caller starts it on the loop thread.
  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finishing_ || call_done_) return Next::kNothing;
    if (end_pending_) {
      end_pending_ = false;
      finishing_ = true;
      return Next::kFinish;
    }
    if (finished_ || service_->silenced_.load() || !NeedsWriteLocked()) return Next::kNothing;
    PrepareWriteLocked();
    return Next::kWrite;
  }

  // Starts what is due. gRPC operations start on the loop thread only: from another thread a
  // Write could land after PluginServer::Stop drained and destroyed the queue. So another thread
  // wakes the loop (one alarm per stream, set again only once it has run), and the loop starts it.
  void Pump() {
    if (service_->loop_->OnLoopThread()) {
      Next next;
      {
        absl::MutexLock lock(&mu_);
        next = NextLocked();
      }
      Start(next);
      return;
    }
    // Set under mu_: the call's end (OnCallDone, on the loop) must see either no wake or one
    // that will run. Were the wake marked pending before it was set, a Stop in between could
    // drain the loop with this stream kept for a wake that never comes.
    absl::MutexLock lock(&mu_);
    if (wake_pending_ || call_done_) return;  // the wake already set will see the new state
    // Fails only while the queue shuts down: the call's done event then follows on the loop.
    wake_pending_ = service_->loop_->Post(&wake_, &woken_);
  }

  void Start(Next next) {
    if (next == Next::kNothing) return;
    DCHECK(service_->loop_->OnLoopThread());
    const bool started = service_->loop_->StartOperation([&] {
      if (next == Next::kWrite) writer_.Write(response_, &written_);
      if (next == Next::kFinish) writer_.Finish(grpc::Status::OK, &finished_call_);
    });
    if (!started) {
      // The queue is shutting down: the server cancels the call and its done event follows.
      absl::MutexLock lock(&mu_);
      writing_ = false;
      finishing_ = false;
      finished_ = true;
    }
  }

  void OnWoken(bool) {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      wake_pending_ = false;
      next = NextLocked();
    }
    Start(next);
    MaybeForget();
  }

  void OnArrived(bool ok) {
    if (!ok) {  // the server is shutting down; no call came, and no done event will
      delete this;
      return;
    }
    service_->ArmStream();  // the next kubelet (or a second stream) may call at any time
    service_->Adopt(this);
  }

  void OnWriteDone(bool ok) {
    Next next = Next::kNothing;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        service_->counters_->list_and_watch_updates.fetch_add(1);
        next = NextLocked();
      } else {
        // The stream is broken (the kubelet went away): the done event follows.
        finished_ = true;
        end_pending_ = false;
      }
    }
    Start(next);
    MaybeForget();
  }

  void OnFinishDone(bool) {
    {
      absl::MutexLock lock(&mu_);
      finishing_ = false;
    }
    MaybeForget();
  }

  // The call is over: finished by us, or cancelled by the client (or by the server's shutdown).
  void OnCallDone(bool) {
    const bool cancelled = context_.IsCancelled();
    {
      absl::MutexLock lock(&mu_);
      call_done_ = true;
      finished_ = true;
      end_pending_ = false;
    }
    if (cancelled) {
      VLOG(1) << service_->set_->resource_name() << ": ListAndWatch stream cancelled by the client";
      if (service_->on_stream_cancelled_) service_->on_stream_cancelled_();
    }
    MaybeForget();
  }

  // Once the call is over and no write, finish or wake of ours is in flight, nothing will reach
  // this object through the queue again.
  void MaybeForget() {
    {
      absl::MutexLock lock(&mu_);
      if (!call_done_ || writing_ || finishing_ || wake_pending_ || forgotten_) return;
      forgotten_ = true;
    }
    {
      absl::MutexLock lock(&gate_->mu);  // waits for a Deliver on another thread to return
      gate_->stream = nullptr;
    }
    service_->set_->Unsubscribe(listener_id_);
    service_->Forget(this);  // may destroy this object: nothing may follow
  }

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

  DevicePluginService* const service_;
  grpc::ServerContext context_;
  v1beta1::Empty request_;
  grpc::ServerAsyncWriter<v1beta1::ListAndWatchResponse> writer_;
  Event arrived_, written_, finished_call_, done_, woken_;
  grpc::Alarm wake_;  // hands work from other threads to the loop (Pump)
  uint64_t listener_id_ = 0;
  const std::shared_ptr<Gate> gate_ = MakeGate(this);
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  size_t sent_count_ ABSL_GUARDED_BY(mu_) = 0;  // devices in that message
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // no more writes
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // our Finish is in flight
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;
  bool forgotten_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;  // wake_ is set and its tag has not run
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

grpc::Status DevicePluginService::GetDevicePluginOptions(const v1beta1::Empty&,
                                                         v1beta1::DevicePluginOptions* response) {
  *response = AdvertisedOptions(options_);
  return grpc::Status::OK;
}

void DevicePluginService::Serve(v1beta1::DevicePlugin::AsyncService* service,
                                CompletionLoop* loop) {
  async_service_ = service;
  loop_ = loop;
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
  ArmStream();
}

void DevicePluginService::ArmStream() {
  auto* stream = new Stream(this);
  if (!loop_->StartOperation([stream] { stream->Wait(); })) delete stream;
}

void DevicePluginService::Adopt(Stream* raw) {
  std::shared_ptr<Stream> stream(raw);
  bool ended;
  {
    // Every stream is kept alive by this map until it is over (Forget).
    absl::MutexLock lock(&mu_);
    ended = ended_;
    streams_[raw] = stream;
  }
  counters_->streams_opened.fetch_add(1);
  if (ended) {
    stream->End();  // shutting down: answer at once, with no devices
  } else {
    LOG(INFO) << set_->resource_name() << ": ListAndWatch stream opened";
    stream->Begin();
  }
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
