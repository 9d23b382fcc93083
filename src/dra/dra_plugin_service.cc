#include "edgeaccel/dra/dra_plugin_service.h"

#include <grpcpp/alarm.h>

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/dra/dra_grpc_server.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

// One unary method whose handler runs off the loop thread: the call arrives on the loop, its
// handler runs on a thread of `workers` (alive only while it runs), and the answer is handed
// back to the loop through an alarm, where it is sent (every gRPC operation of a call starts on
// the loop thread, where it cannot race the queue's shutdown). When the queue is shutting down
// by the time the answer is ready, it goes nowhere: the server has cancelled the call.
template <typename Request, typename Response>
class OffLoopMethod {
 public:
  using RequestFn = typename UnaryMethod<Request, Response>::RequestFn;
  using Handler = typename UnaryMethod<Request, Response>::CallHandler;

  static void Serve(CompletionLoop* loop, Workers* workers, RequestFn request, Handler handler) {
    Arm(std::make_shared<const OffLoopMethod>(loop, workers, std::move(request), std::move(handler)));
  }

  OffLoopMethod(CompletionLoop* loop, Workers* workers, RequestFn request, Handler handler)
      : loop_(loop), workers_(workers), request_(std::move(request)), handler_(std::move(handler)) {}

 private:
  class Call final : public CompletionTag {
   public:
    explicit Call(std::shared_ptr<const OffLoopMethod> method)
        : method_(std::move(method)), responder_(&context_) {}
    void Wait() { method_->request_(&context_, &request_, &responder_, this); }

    void Proceed(bool ok) override {
      switch (state_) {
        case State::kWaiting:  // the call arrived (or, not ok, no call will come)
          if (!ok) break;
          Arm(method_);  // the next call may arrive while this one is answered
          state_ = State::kWorking;
          if (absl::Status started = method_->workers_->Start([this] { Work(); }); !started.ok()) {
            if (absl::IsCancelled(started)) break;  // stopping: the server cancels the call
            // No thread to answer it on (the process limit): the call fails with the reason,
            // here on the loop, and the next one is served as usual.
            LOG(ERROR) << "a DRA call cannot be answered: " << started.message();
            status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(started.message()));
            state_ = State::kAnswering;
            if (method_->loop_->StartOperation([&] { responder_.FinishWithError(status_, this); })) return;
            break;
          }
          return;
        case State::kWorking: {  // the alarm: the answer is ready
          state_ = State::kAnswering;
          const bool started = method_->loop_->StartOperation([&] {
            if (status_.ok()) {
              responder_.Finish(response_, status_, this);
            } else {
              responder_.FinishWithError(status_, this);
            }
          });
          if (started) return;
          break;
        }
        case State::kAnswering:  // the answer went out (or the call was cancelled)
          break;
      }
      delete this;
    }

   private:
    enum class State { kWaiting, kWorking, kAnswering };

    // On a worker thread; no gRPC operation of the call is pending meanwhile.
    void Work() {
      status_ = method_->handler_(context_, request_, &response_);
      if (!method_->loop_->Post(&alarm_, this)) delete this;
    }

    const std::shared_ptr<const OffLoopMethod> method_;
    grpc::ServerContext context_;
    Request request_;
    Response response_;
    grpc::Status status_;
    grpc::ServerAsyncResponseWriter<Response> responder_;
    grpc::Alarm alarm_;
    State state_ = State::kWaiting;
  };

  static void Arm(const std::shared_ptr<const OffLoopMethod>& method) {
    auto* call = new Call(method);
    if (!method->loop_->StartOperation([call] { call->Wait(); })) delete call;
  }

  CompletionLoop* const loop_;
  Workers* const workers_;
  const RequestFn request_;
  const Handler handler_;
};

// Counts one call of a method: in flight while it lives, then answered, with its duration.
class CallCount {
 public:
  explicit CallCount(DraCallCounters* counters) : counters_(counters), start_(absl::Now()) {
    counters_->in_flight.fetch_add(1);
  }
  ~CallCount() {
    counters_->duration.Observe(absl::Now() - start_);
    counters_->calls.fetch_add(1);
    counters_->in_flight.fetch_sub(1);
  }
  CallCount(const CallCount&) = delete;
  CallCount& operator=(const CallCount&) = delete;

 private:
  DraCallCounters* const counters_;
  const absl::Time start_;
};

// A shared device's share_id goes to the kubelet (v1, from 1.35: it keeps it in its claim state
// and the pod-resources API). v1beta1 has no such field; a kubelet that speaks only v1beta1
// (1.32, 1.33) predates consumable capacity and hears of the device without it.
void SetShareId(const PreparedDevice& device, drav1::Device* out) {
  if (!device.share_id.empty()) out->set_share_id(device.share_id);
}
void SetShareId(const PreparedDevice&, drav1beta1::Device*) {}

using HealthStreams = DraPluginService::HealthStreams;

// How long the kubelet is to hold a device's reported health (health_check_timeout_seconds,
// 1.35+): until the next report, however far off. Health is sent on every change, and the kubelet
// forgets all of it when the stream ends (clearDriver); but it turns a report older than this
// Unknown in the pod's allocatedResourcesStatus, 30 s by default (healthinfo.go
// DefaultHealthTimeout), and a device that stays healthy sends nothing (the lab's 1.36.2 showed
// Unknown from 80 s on). Ten years: whole seconds, far below time.Duration's 292-year limit.
constexpr int64_t kHealthHoldsSeconds = int64_t{10} * 365 * 24 * 3600;

// The complete health list, for every new version of the device set.
HealthStreams::Messages HealthMessages(const DraPluginService* service) {
  HealthStreams::Messages messages;
  messages.build = [service](const Snapshot& snapshot, drahealth::NodeWatchResourcesResponse* out) {
    *out = service->HealthMessage(snapshot);
  };
  return messages;
}

SnapshotStreamsBase::Hooks HealthHooks(DraCounters* counters) {
  SnapshotStreamsBase::Hooks hooks;
  hooks.opened = [counters](bool serving) {
    counters->health_streams.fetch_add(1);
    if (serving) VLOG(1) << "DRA health stream opened";
  };
  hooks.ended = [](bool) { VLOG(1) << "DRA health stream ended"; };
  return hooks;
}

}  // namespace

DraPluginService::DraPluginService(ClaimPreparer* preparer, DeviceSet* set, std::string pool,
                                   DraCounters* counters)
    : preparer_(preparer),
      pool_(std::move(pool)),
      counters_(counters),
      health_streams_(set, "DRA health", HealthMessages(this), HealthHooks(counters)) {}

DraPluginService::~DraPluginService() = default;

template <typename Request, typename Response>
grpc::Status DraPluginService::Prepare(const Request& request, Response* response) {
  CallCount count(&counters_->prepare);
  std::vector<ClaimRef> claims;
  for (const auto& claim : request.claims()) {
    claims.push_back(ClaimRef{claim.namespace_(), claim.name(), claim.uid()});
  }
  for (auto& [uid, outcome] : preparer_->Prepare(claims)) {
    auto& entry = (*response->mutable_claims())[uid];
    if (!outcome.error.empty()) {
      counters_->prepare.claim_errors.fetch_add(1);
      entry.set_error(outcome.error);
      continue;
    }
    for (const PreparedDevice& device : outcome.devices) {
      auto* out = entry.add_devices();
      for (const std::string& name : device.requests) out->add_request_names(name);
      out->set_pool_name(device.pool);
      out->set_device_name(device.device);
      for (const std::string& id : device.cdi_ids) out->add_cdi_device_ids(id);
      SetShareId(device, out);
    }
  }
  return grpc::Status::OK;
}

template <typename Request, typename Response>
grpc::Status DraPluginService::Unprepare(const Request& request, Response* response) {
  CallCount count(&counters_->unprepare);
  std::vector<ClaimRef> claims;
  for (const auto& claim : request.claims()) {
    claims.push_back(ClaimRef{claim.namespace_(), claim.name(), claim.uid()});
  }
  for (auto& [uid, error] : preparer_->Unprepare(claims)) {
    auto& entry = (*response->mutable_claims())[uid];
    if (!error.empty()) {
      counters_->unprepare.claim_errors.fetch_add(1);
      entry.set_error(error);
    }
  }
  return grpc::Status::OK;
}

template grpc::Status DraPluginService::Prepare(const drav1::NodePrepareResourcesRequest&,
                                                drav1::NodePrepareResourcesResponse*);
template grpc::Status DraPluginService::Prepare(const drav1beta1::NodePrepareResourcesRequest&,
                                                drav1beta1::NodePrepareResourcesResponse*);
template grpc::Status DraPluginService::Unprepare(const drav1::NodeUnprepareResourcesRequest&,
                                                  drav1::NodeUnprepareResourcesResponse*);
template grpc::Status DraPluginService::Unprepare(const drav1beta1::NodeUnprepareResourcesRequest&,
                                                  drav1beta1::NodeUnprepareResourcesResponse*);

drahealth::NodeWatchResourcesResponse DraPluginService::HealthMessage(const Snapshot& snapshot) const {
  drahealth::NodeWatchResourcesResponse message;
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  for (const Device& device : snapshot.devices) {
    if (!device.replica_of.empty()) continue;
    auto* entry = message.add_devices();
    entry->mutable_device()->set_pool_name(pool_);
    entry->mutable_device()->set_device_name(DraDeviceName(device));
    entry->set_health(device.health == Health::kHealthy ? drahealth::HEALTHY : drahealth::UNHEALTHY);
    entry->set_last_updated_time(now);
    entry->set_health_check_timeout_seconds(kHealthHoldsSeconds);
    // The kubelet keeps at most 1024 characters (1.36's api.proto): cut as it would.
    std::string reason = device.unhealthy_reason;
    if (reason.size() > 1024) reason = reason.substr(0, 1021) + "...";
    entry->set_message(reason);
  }
  return message;
}

void DraPluginService::Serve(drav1::DRAPlugin::AsyncService* v1,
                             drav1beta1::DRAPlugin::AsyncService* v1beta1,
                             drahealth::DRAResourceHealth::AsyncService* health, CompletionLoop* loop,
                             Route route) {
  grpc::ServerCompletionQueue* cq = loop->cq();
  Workers* calls = &calls_;
  // Whose a call is: this service's, or where several share the server, the one `route` names.
  auto owner = [this, route](const grpc::ServerContext& context) -> DraPluginService* {
    return route != nullptr ? route(context) : this;
  };
  auto prepare = [owner](const grpc::ServerContext& context, const auto& request, auto* response) {
    DraPluginService* service = owner(context);
    if (service == nullptr) return DraGrpcServer::NoOwner(context);
    return service->Prepare(request, response);
  };
  auto unprepare = [owner](const grpc::ServerContext& context, const auto& request, auto* response) {
    DraPluginService* service = owner(context);
    if (service == nullptr) return DraGrpcServer::NoOwner(context);
    return service->Unprepare(request, response);
  };
  OffLoopMethod<drav1::NodePrepareResourcesRequest, drav1::NodePrepareResourcesResponse>::Serve(
      loop, calls, [v1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1->RequestNodePrepareResources(context, request, responder, cq, cq, tag);
      },
      prepare);
  OffLoopMethod<drav1::NodeUnprepareResourcesRequest, drav1::NodeUnprepareResourcesResponse>::Serve(
      loop, calls, [v1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1->RequestNodeUnprepareResources(context, request, responder, cq, cq, tag);
      },
      unprepare);
  OffLoopMethod<drav1beta1::NodePrepareResourcesRequest, drav1beta1::NodePrepareResourcesResponse>::Serve(
      loop, calls, [v1beta1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1beta1->RequestNodePrepareResources(context, request, responder, cq, cq, tag);
      },
      prepare);
  OffLoopMethod<drav1beta1::NodeUnprepareResourcesRequest, drav1beta1::NodeUnprepareResourcesResponse>::Serve(
      loop, calls, [v1beta1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1beta1->RequestNodeUnprepareResources(context, request, responder, cq, cq, tag);
      },
      unprepare);
  HealthStreams::Route health_route;
  if (route != nullptr) {
    health_route = [route](const grpc::ServerContext& context) -> HealthStreams* {
      DraPluginService* service = route(context);
      return service != nullptr ? &service->health_streams_ : nullptr;
    };
  }
  health_streams_.Serve(
      loop,
      [health, cq](auto* context, auto* request, auto* writer, void* tag) {
        health->RequestNodeWatchResources(context, request, writer, cq, cq, tag);
      },
      std::move(health_route));
}

void DraPluginService::JoinCalls() { calls_.Drain(absl::InfiniteDuration()); }

}  // namespace edgeaccel
