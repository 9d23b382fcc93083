// SnapshotStreams: one server-streaming gRPC method that sends the state of a DeviceSet, served
// on a CompletionLoop (completion_loop.h). The device plugin's ListAndWatch
// (device_plugin_service.h) and DRA's NodeWatchResources (dra/dra_plugin_service.h) are both one.
//
// Every call of the method is a stream with its own state (the newest snapshot, what it last
// sent, whether a write is in flight); no state is shared between streams, so an abandoned
// stream cannot swallow an update meant for a live one. A stream:
//  * when its call arrives, subscribes to the DeviceSet and sends a message for the current
//    snapshot;
//  * on a change keeps the newest snapshot and sends a message for it as soon as no write is in
//    flight: changes that come during a write go out as one message, of the newest state;
//  * sends a message for a snapshot it already sent only when `resend` says so (Recheck());
//  * sends nothing while `paused` says so, and stays open;
//  * ends with OK on EndStreams(), at once when its call arrives after it;
//  * is over when the client cancels it, or the server shuts down.
// Nothing sleeps per stream and nothing polls.
//
// Several SnapshotStreams may serve one method of one server on one loop (DRA drivers sharing a
// gRPC server): gRPC gives an arriving call to whichever of them asked first, and `route` says
// whose the call is (by its peer: the connection it came on); that one serves it.
//
// Threads: every gRPC operation of a call starts on the loop thread, where it cannot race the
// queue's shutdown. The DeviceSet's listeners run on the thread that updated the set; a change
// they deliver, like Recheck() and EndStreams() from any thread, wakes the loop through one
// alarm per stream (CompletionLoop::Post), set again only once it has run. Every hook (Messages
// and Hooks) runs on the loop thread; `build`, `resend`, `paused` and `written` run with the
// stream's lock held, and none may call back into this object.
#ifndef EDGEACCEL_KUBELET_SNAPSHOT_STREAM_H_
#define EDGEACCEL_KUBELET_SNAPSHOT_STREAM_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/completion_loop.h"

namespace edgeaccel {

// The part of SnapshotStreams that does not depend on the method's message types.
class SnapshotStreamsBase {
 public:
  // What the owner of the method is told, and asked; each one may be left unset.
  struct Hooks {
    // Whether to send nothing for now; the streams stay open. Call Recheck() once it changes.
    std::function<bool()> paused;
    // A message went out.
    std::function<void()> written;
    // A call arrived. `serving` is false when EndStreams() came first (the call ends at once).
    std::function<void(bool serving)> opened;
    // A call is over. `cancelled`: by the client (or the server's shutdown), not by our Finish.
    std::function<void(bool cancelled)> ended;
  };

  virtual ~SnapshotStreamsBase();  // DFATAL with a stream still open
  SnapshotStreamsBase(const SnapshotStreamsBase&) = delete;
  SnapshotStreamsBase& operator=(const SnapshotStreamsBase&) = delete;

  // Finishes every open stream with OK, and from now on every call as soon as it arrives
  // (shutdown, socket re-created). Any thread.
  void EndStreams();
  // Streams open now.
  int OpenStreams() const;
  // Waits until at most `most` streams are open (the others' ends written), at most until
  // `deadline`. True when so.
  bool WaitForStreamsAtMost(int most, absl::Time deadline) const;
  // Every stream asks `resend` (and `paused`) again, and writes if they now allow. Any thread.
  void Recheck();

 protected:
  class Call;  // one call of the method: the state machine

  // Which streams a call that arrived here belongs to (`this` or another serving the same method
  // on the same loop); null: none (the call ends at once).
  using RouteFn = std::function<SnapshotStreamsBase*(const grpc::ServerContext& context)>;

  SnapshotStreamsBase(DeviceSet* set, std::string name, Hooks hooks);
  // Starts waiting for calls on `loop` (once per server; the loop outlives every call). Unset
  // `route`: every call that arrives here is this one's.
  void ServeOn(CompletionLoop* loop, RouteFn route);

 private:
  virtual Call* NewCall() = 0;
  // Waits for the next call.
  void Arm();
  // A call arrived: keep it (the map owns it from here) and start it; where `serve` is false,
  // end it at once (no streams own it).
  void Adopt(Call* call, bool serve);
  void Forget(Call* call);

  DeviceSet* const set_;
  const std::string name_;
  const Hooks hooks_;
  CompletionLoop* loop_ = nullptr;
  RouteFn route_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Call*, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

class SnapshotStreamsBase::Call {
 public:
  explicit Call(SnapshotStreamsBase* streams);
  virtual ~Call();

  // Waits for the method's next call on the loop's queue. On the loop thread (StartOperation).
  void Wait();
  // On the loop thread, when the call arrives: subscribes, and sends the current snapshot.
  void Begin();
  // A new snapshot, from any thread: kept, and sent from the loop thread as soon as no write is
  // in flight.
  void Deliver(std::shared_ptr<const Snapshot> snapshot);
  // Writes if `resend` or `paused` now allow. Any thread.
  void Recheck() { Pump(); }
  // Ends the stream with OK once no write is in flight. Any thread.
  void End();

 protected:
  grpc::ServerContext* context() { return &context_; }
  SnapshotStreamsBase* streams() const { return streams_; }

 private:
  // The typed part (SnapshotStreams<Request, Response>::TypedCall).
  // The call was routed to other streams (streams() says which): take their messages.
  virtual void Rebound() = 0;
  // Asks for the method's next call, with `tag` told when it arrives.
  virtual void RequestCall(void* tag) = 0;
  // Whether the message last sent, for this same snapshot version, must go again.
  virtual bool ResendLocked(const Snapshot& latest) = 0;
  // Makes the message for `latest`, the one the next StartWrite sends.
  virtual void ComposeLocked(const Snapshot& latest) = 0;
  virtual void StartWrite(void* tag) = 0;
  virtual void StartFinish(void* tag) = 0;

  // What the listener reaches the stream through. A listener may still be running when
  // Unsubscribe returns (it runs on the thread that updated the set); had it held the stream
  // itself, the stream could outlive Forget and reach a service already destroyed. The gate is
  // closed before the stream is forgotten, and closing it waits for a delivery in progress.
  struct Gate {
    absl::Mutex mu;
    Call* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  // One kind of event of this call, as the loop delivers it.
  class Event final : public CompletionTag {
   public:
    Event(Call* call, void (Call::*handler)(bool)) : call_(call), handler_(handler) {}
    void Proceed(bool ok) override { (call_->*handler_)(ok); }

   private:
    Call* const call_;
    void (Call::*const handler_)(bool);
  };

  enum class Next { kNothing, kWrite, kFinish };

  Next NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pump();
  void Start(Next next);
  void OnArrived(bool ok);
  void OnWoken(bool ok);
  void OnWriteDone(bool ok);
  void OnFinishDone(bool ok);
  void OnCallDone(bool ok);
  void MaybeForget();

  SnapshotStreamsBase* streams_;  // whose the call is: set again once, on its arrival
  grpc::ServerContext context_;
  Event arrived_, written_, finished_call_, done_, woken_;
  grpc::Alarm wake_;  // hands work from other threads to the loop (Pump)
  const std::shared_ptr<Gate> gate_;
  uint64_t listener_id_ = 0;
  bool subscribed_ = false;
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> latest_ ABSL_GUARDED_BY(mu_);
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;     // no more writes
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;  // Finish once no write is in flight
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;    // our Finish is in flight
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;
  bool forgotten_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;  // wake_ is set and its tag has not run
};

template <typename Request, typename Response>
class SnapshotStreams final : public SnapshotStreamsBase {
 public:
  // The generated AsyncService's RequestX for the method, bound to its service and queue.
  using RequestFn = std::function<void(grpc::ServerContext*, Request*,
                                       grpc::ServerAsyncWriter<Response>*, void* tag)>;
  struct Messages {
    // Fills `out` (empty) with the message for `snapshot`. Required.
    std::function<void(const Snapshot& snapshot, Response* out)> build;
    // Whether `sent`, the message last sent, must go again for `latest`, a snapshot of the same
    // version (what the message shows of it may have changed). Unset: never.
    std::function<bool(const Snapshot& latest, const Response& sent)> resend;
  };

  // `set` outlives this object; `name` names it in logs.
  SnapshotStreams(DeviceSet* set, std::string name, Messages messages, Hooks hooks = {})
      : SnapshotStreamsBase(set, std::move(name), std::move(hooks)), messages_(std::move(messages)) {}

  // Whose a call that arrived here is; see SnapshotStreamsBase::RouteFn.
  using Route = std::function<SnapshotStreams*(const grpc::ServerContext& context)>;

  // Starts answering the method (registered with a started server) on `loop`.
  void Serve(CompletionLoop* loop, RequestFn request, Route route = nullptr) {
    request_ = std::move(request);
    RouteFn base_route;
    if (route != nullptr) {
      base_route = [route = std::move(route)](const grpc::ServerContext& context) -> SnapshotStreamsBase* {
        return route(context);
      };
    }
    ServeOn(loop, std::move(base_route));
  }

 private:
  class TypedCall final : public Call {
   public:
    explicit TypedCall(SnapshotStreams* streams) : Call(streams), streams_(streams), writer_(context()) {}

   private:
    void Rebound() override { streams_ = static_cast<SnapshotStreams*>(streams()); }
    void RequestCall(void* tag) override {
      streams_->request_(context(), &request_, &writer_, tag);
    }
    bool ResendLocked(const Snapshot& latest) override {
      return streams_->messages_.resend && streams_->messages_.resend(latest, response_);
    }
    void ComposeLocked(const Snapshot& latest) override {
      response_.Clear();
      streams_->messages_.build(latest, &response_);
    }
    void StartWrite(void* tag) override { writer_.Write(response_, tag); }
    void StartFinish(void* tag) override { writer_.Finish(grpc::Status::OK, tag); }

    SnapshotStreams* streams_;  // as Call's
    Request request_;
    grpc::ServerAsyncWriter<Response> writer_;
    // Owned by gRPC while a write is in flight; afterwards the message last sent.
    Response response_;
  };

  Call* NewCall() override { return new TypedCall(this); }

  const Messages messages_;
  RequestFn request_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_SNAPSHOT_STREAM_H_
