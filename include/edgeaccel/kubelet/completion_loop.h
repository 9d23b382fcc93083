// CompletionLoop: gRPC's asynchronous server API, driven by one thread of ours.
//
// Why not gRPC's callback or synchronous API: both bring threads that wake on timers while the
// daemon is idle. The callback API's completion-queue threads wait with a 1 s deadline each
// (two of them, ~4 wake-ups/s in all), and the sync API's pollers every 10 s. Here one thread
// ("ea-grpc") waits on the completion queue with no deadline: it wakes only when a call
// arrives, a write completes or a stream ends. Handlers run on that thread, inline, as the sync
// API runs them on its pollers; Allocate and the rest are microseconds of work, so one thread
// keeps up with the kubelet, which calls one at a time (docs/footprint.md has the figures).
//
// A call's state is a CompletionTag; its Proceed(ok) runs on the loop thread for each event.
#ifndef EDGEACCEL_KUBELET_COMPLETION_LOOP_H_
#define EDGEACCEL_KUBELET_COMPLETION_LOOP_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace edgeaccel {

class CompletionTag {
 public:
  virtual ~CompletionTag() = default;
  // One event of the call: `ok` is gRPC's (false: the call or the server is going away).
  virtual void Proceed(bool ok) = 0;
};

class CompletionLoop {
 public:
  CompletionLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq, std::string thread_name);
  ~CompletionLoop();  // Drain()s if needed

  grpc::ServerCompletionQueue* cq() const { return cq_.get(); }
  void Start();
  // Starts `operation` (one gRPC operation that will post to this queue: a RequestX waiting for
  // the next call, a Write, a Finish) unless the queue is being shut down: gRPC aborts on an
  // operation begun on a shut-down queue. False then, and nothing was started: the caller undoes
  // what it prepared. Held against Drain, so no operation slips in after the queue's Shutdown.
  bool StartOperation(const std::function<void()>& operation);
  // Wakes the loop thread with `tag` (its Proceed(true) runs there) through `alarm`, set to fire
  // at once. For work another thread hands to the loop: every gRPC operation of a call starts on
  // the loop thread, where it cannot race the queue's shutdown. False when the queue is being
  // shut down (nothing will run). An alarm is set again only after its tag has run.
  bool Post(grpc::Alarm* alarm, CompletionTag* tag);
  // Call after grpc::Server::Shutdown(): shuts the queue down, runs the events left (every
  // waiting call is told ok=false and frees itself) and joins the thread.
  void Drain();
  // Whether the caller is the loop thread (or drains the queue of a loop never started).
  bool OnLoopThread() const { return std::this_thread::get_id() == loop_thread_.load(); }

 private:
  void Run();

  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  const std::string thread_name_;
  std::thread thread_;
  std::atomic<std::thread::id> loop_thread_{};
  absl::Mutex mu_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool drained_ = false;
};

// One unary method served on a loop: a call object waits for the next call of the method,
// answers it with `handler` on the loop thread, and arms the next one before answering.
template <typename Request, typename Response>
class UnaryMethod {
 public:
  // The generated AsyncService's RequestX, bound to its service and queue.
  using RequestFn = std::function<void(grpc::ServerContext*, Request*,
                                       grpc::ServerAsyncResponseWriter<Response>*, void* tag)>;
  using Handler = std::function<grpc::Status(const Request&, Response*)>;
  // One that also looks at the call: its peer says which connection it came on.
  using CallHandler =
      std::function<grpc::Status(const grpc::ServerContext&, const Request&, Response*)>;

  // Starts waiting for calls on `loop`; lives as long as calls can arrive (the last waiting call
  // object holds it, and is told ok=false when the queue drains).
  static void Serve(CompletionLoop* loop, RequestFn request, Handler handler) {
    ServeSeeingCall(loop, std::move(request),
                    [handler = std::move(handler)](const grpc::ServerContext&, const Request& in,
                                                   Response* out) { return handler(in, out); });
  }
  static void ServeSeeingCall(CompletionLoop* loop, RequestFn request, CallHandler handler) {
    Arm(std::make_shared<const UnaryMethod>(loop, std::move(request), std::move(handler)));
  }

  UnaryMethod(CompletionLoop* loop, RequestFn request, CallHandler handler)
      : loop_(loop), request_(std::move(request)), handler_(std::move(handler)) {}

 private:
  class Call final : public CompletionTag {
   public:
    explicit Call(std::shared_ptr<const UnaryMethod> method)
        : method_(std::move(method)), responder_(&context_) {}
    void Wait() { method_->request_(&context_, &request_, &responder_, this); }
    void Proceed(bool ok) override {
      if (answered_ || !ok) {  // the answer went out, or no call will come (shutdown)
        delete this;
        return;
      }
      answered_ = true;
      Arm(method_);  // the next call may arrive while this one is answered
      const grpc::Status status = method_->handler_(context_, request_, &response_);
      const bool started = method_->loop_->StartOperation([&] {
        if (status.ok()) {
          responder_.Finish(response_, status, this);
        } else {
          responder_.FinishWithError(status, this);
        }
      });
      if (!started) delete this;  // shutting down: the call is cancelled, no event will come
    }

   private:
    const std::shared_ptr<const UnaryMethod> method_;
    grpc::ServerContext context_;
    Request request_;
    Response response_;
    grpc::ServerAsyncResponseWriter<Response> responder_;
    bool answered_ = false;
  };

  static void Arm(const std::shared_ptr<const UnaryMethod>& method) {
    auto* call = new Call(method);
    if (!method->loop_->StartOperation([call] { call->Wait(); })) delete call;
  }

  CompletionLoop* const loop_;
  const RequestFn request_;
  const CallHandler handler_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_COMPLETION_LOOP_H_
