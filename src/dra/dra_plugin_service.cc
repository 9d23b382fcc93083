#include "edgeaccel/dra/dra_plugin_service.h"

#include <grpcpp/alarm.h>

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/dra_driver.h"
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
  using Handler = typename UnaryMethod<Request, Response>::Handler;

  static void Serve(CompletionLoop* loop, TransientThreads* workers, RequestFn request, Handler handler) {
    Arm(std::make_shared<const OffLoopMethod>(loop, workers, std::move(request), std::move(handler)));
  }

  OffLoopMethod(CompletionLoop* loop, TransientThreads* workers, RequestFn request, Handler handler)
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
          if (method_->workers_->Run([this] { Work(); })) return;
          break;
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
      status_ = method_->handler_(request_, &response_);
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
  TransientThreads* const workers_;
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

}  // namespace

// One NodeWatchResources call: the driver's health list, written again on every change of the
// device set. Built like the ListAndWatch stream (kubelet/device_plugin_service.cc): every gRPC
// operation starts on the loop thread; another thread hands the loop a wake-up (an alarm); the
// DeviceSet listener reaches the stream through a gate closed before the stream is forgotten.
class DraPluginService::HealthStream {
 public:
  explicit HealthStream(DraPluginService* service)
      : service_(service),
        writer_(&context_),
        arrived_(this, &HealthStream::OnArrived),
        written_(this, &HealthStream::OnWriteDone),
        finished_call_(this, &HealthStream::OnFinishDone),
        done_(this, &HealthStream::OnCallDone),
        woken_(this, &HealthStream::OnWoken) {
    absl::MutexLock lock(&gate_->mu);
    gate_->stream = this;
  }

  void Wait() {
    context_.AsyncNotifyWhenDone(&done_);
    grpc::ServerCompletionQueue* cq = service_->loop_->cq();
    service_->health_service_->RequestNodeWatchResources(&context_, &request_, &writer_, cq, cq,
                                                         &arrived_);
  }

  void Begin() {
    listener_id_ = service_->set_->Subscribe([gate = gate_](std::shared_ptr<const Snapshot> snapshot) {
      absl::MutexLock lock(&gate->mu);
      if (gate->stream != nullptr) gate->stream->Deliver(std::move(snapshot));
    });
    Deliver(service_->set_->Current());
  }

  void Deliver(std::shared_ptr<const Snapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!latest_ || snapshot->version > latest_->version) latest_ = std::move(snapshot);
    }
    Pump();
  }

  void End() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      end_pending_ = true;
    }
    Pump();
  }

 private:
  struct Gate {
    absl::Mutex mu;
    HealthStream* stream ABSL_GUARDED_BY(mu) = nullptr;
  };

  class Event final : public CompletionTag {
   public:
    Event(HealthStream* stream, void (HealthStream::*handler)(bool)) : stream_(stream), handler_(handler) {}
    void Proceed(bool ok) override { (stream_->*handler_)(ok); }

   private:
    HealthStream* const stream_;
    void (HealthStream::*const handler_)(bool);
  };

  enum class Next { kNothing, kWrite, kFinish };

  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finishing_ || call_done_) return Next::kNothing;
    if (end_pending_) {
      end_pending_ = false;
      finishing_ = true;
      return Next::kFinish;
    }
    if (finished_ || !latest_ || (sent_any_ && latest_->version == sent_version_)) return Next::kNothing;
    writing_ = true;
    sent_any_ = true;
    sent_version_ = latest_->version;
    response_ = service_->HealthMessage(*latest_);
    return Next::kWrite;
  }

  void Pump() {
    absl::ReleasableMutexLock lock(&mu_);
    if (call_done_) return;  // the call is over (and the service may be going)
    if (service_->loop_->OnLoopThread()) {
      const Next next = NextLocked();
      lock.Release();
      Start(next);
      return;
    }
    if (wake_pending_) return;
    wake_pending_ = service_->loop_->Post(&wake_, &woken_);
  }

  void Start(Next next) {
    if (next == Next::kNothing) return;
    const bool started = service_->loop_->StartOperation([&] {
      if (next == Next::kWrite) writer_.Write(response_, &written_);
      if (next == Next::kFinish) writer_.Finish(grpc::Status::OK, &finished_call_);
    });
    if (!started) {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      finishing_ = false;
      finished_ = true;
    }
  }

  void OnArrived(bool ok) {
    if (!ok) {
      delete this;
      return;
    }
    service_->ArmHealthStream();
    service_->Adopt(this);
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

  void OnWriteDone(bool ok) {
    Next next = Next::kNothing;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok) {
        next = NextLocked();
      } else {
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

  void OnCallDone(bool) {
    {
      absl::MutexLock lock(&mu_);
      call_done_ = true;
      finished_ = true;
      end_pending_ = false;
    }
    VLOG(1) << "DRA health stream ended";
    MaybeForget();
  }

  void MaybeForget() {
    {
      absl::MutexLock lock(&mu_);
      if (!call_done_ || writing_ || finishing_ || wake_pending_ || forgotten_) return;
      forgotten_ = true;
    }
    {
      absl::MutexLock lock(&gate_->mu);
      gate_->stream = nullptr;
    }
    if (listener_id_ != 0) service_->set_->Unsubscribe(listener_id_);
    service_->Forget(this);  // may destroy this object
  }

  DraPluginService* const service_;
  grpc::ServerContext context_;
  drahealth::NodeWatchResourcesRequest request_;
  grpc::ServerAsyncWriter<drahealth::NodeWatchResourcesResponse> writer_;
  Event arrived_, written_, finished_call_, done_, woken_;
  grpc::Alarm wake_;
  const std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  uint64_t listener_id_ = 0;
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;
  bool forgotten_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;
  drahealth::NodeWatchResourcesResponse response_;
};

DraPluginService::DraPluginService(ClaimPreparer* preparer, DeviceSet* set, std::string pool,
                                   DraCounters* counters)
    : preparer_(preparer), set_(set), pool_(std::move(pool)), counters_(counters) {}

DraPluginService::~DraPluginService() {
  absl::MutexLock lock(&mu_);
  LOG_IF(DFATAL, !streams_.empty()) << "DraPluginService destroyed with open health streams";
}

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
    // The kubelet keeps at most 1024 characters (1.36's api.proto): cut as it would.
    std::string reason = device.unhealthy_reason;
    if (reason.size() > 1024) reason = reason.substr(0, 1021) + "...";
    entry->set_message(reason);
  }
  return message;
}

void DraPluginService::Serve(drav1::DRAPlugin::AsyncService* v1,
                             drav1beta1::DRAPlugin::AsyncService* v1beta1,
                             drahealth::DRAResourceHealth::AsyncService* health, CompletionLoop* loop) {
  loop_ = loop;
  health_service_ = health;
  grpc::ServerCompletionQueue* cq = loop->cq();
  TransientThreads* calls = &calls_;
  OffLoopMethod<drav1::NodePrepareResourcesRequest, drav1::NodePrepareResourcesResponse>::Serve(
      loop, calls, [v1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1->RequestNodePrepareResources(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return Prepare(request, response); });
  OffLoopMethod<drav1::NodeUnprepareResourcesRequest, drav1::NodeUnprepareResourcesResponse>::Serve(
      loop, calls, [v1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1->RequestNodeUnprepareResources(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return Unprepare(request, response); });
  OffLoopMethod<drav1beta1::NodePrepareResourcesRequest, drav1beta1::NodePrepareResourcesResponse>::Serve(
      loop, calls, [v1beta1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1beta1->RequestNodePrepareResources(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return Prepare(request, response); });
  OffLoopMethod<drav1beta1::NodeUnprepareResourcesRequest, drav1beta1::NodeUnprepareResourcesResponse>::Serve(
      loop, calls, [v1beta1, cq](auto* context, auto* request, auto* responder, void* tag) {
        v1beta1->RequestNodeUnprepareResources(context, request, responder, cq, cq, tag);
      },
      [this](const auto& request, auto* response) { return Unprepare(request, response); });
  ArmHealthStream();
}

void DraPluginService::ArmHealthStream() {
  auto* stream = new HealthStream(this);
  if (!loop_->StartOperation([stream] { stream->Wait(); })) delete stream;
}

void DraPluginService::Adopt(HealthStream* raw) {
  std::shared_ptr<HealthStream> stream(raw);
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
    streams_[raw] = stream;
  }
  counters_->health_streams.fetch_add(1);
  if (ended) {
    stream->End();
  } else {
    VLOG(1) << "DRA health stream opened";
    stream->Begin();
  }
}

void DraPluginService::Forget(HealthStream* stream) {
  std::shared_ptr<HealthStream> last;
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  last = std::move(it->second);
  streams_.erase(it);
}

void DraPluginService::EndStreams() {
  std::vector<std::shared_ptr<HealthStream>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    for (const auto& [ptr, stream] : streams_) open.push_back(stream);
  }
  for (const auto& stream : open) stream->End();
}

void DraPluginService::JoinCalls() { calls_.Join(); }

int DraPluginService::OpenHealthStreams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace edgeaccel
