#include "edgeaccel/kubelet/snapshot_stream.h"

#include <vector>

#include "glog/logging.h"

namespace edgeaccel {

// ---------------------------------------------------------------------------------------------
// One call

SnapshotStreamsBase::Call::Call(SnapshotStreamsBase* streams)
    : streams_(streams),
      arrived_(this, &Call::OnArrived),
      written_(this, &Call::OnWriteDone),
      finished_call_(this, &Call::OnFinishDone),
      done_(this, &Call::OnCallDone),
      woken_(this, &Call::OnWoken),
      gate_(std::make_shared<Gate>()) {
  absl::MutexLock lock(&gate_->mu);
  gate_->call = this;
}

SnapshotStreamsBase::Call::~Call() = default;

void SnapshotStreamsBase::Call::Wait() {
  context_.AsyncNotifyWhenDone(&done_);  // before the request: it must cover the whole call
  RequestCall(&arrived_);
}

void SnapshotStreamsBase::Call::Begin() {
  listener_id_ = streams_->set_->Subscribe([gate = gate_](std::shared_ptr<const Snapshot> snapshot) {
    absl::MutexLock lock(&gate->mu);
    if (gate->call != nullptr) gate->call->Deliver(std::move(snapshot));
  });
  subscribed_ = true;
  Deliver(streams_->set_->Current());
}

void SnapshotStreamsBase::Call::Deliver(std::shared_ptr<const Snapshot> snapshot) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!latest_ || snapshot->version > latest_->version) latest_ = std::move(snapshot);
  }
  Pump();
}

void SnapshotStreamsBase::Call::End() {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    end_pending_ = true;
  }
  Pump();
}

// What the stream does next, decided under mu_; the caller starts it on the loop thread.
SnapshotStreamsBase::Call::Next SnapshotStreamsBase::Call::NextLocked() {
  if (writing_ || finishing_ || call_done_) return Next::kNothing;
  if (end_pending_) {
    end_pending_ = false;
    finishing_ = true;
    return Next::kFinish;
  }
  if (finished_ || !latest_) return Next::kNothing;
  if (streams_->hooks_.paused && streams_->hooks_.paused()) return Next::kNothing;
  if (sent_any_ && latest_->version == sent_version_ && !ResendLocked(*latest_)) return Next::kNothing;
  writing_ = true;
  sent_any_ = true;
  sent_version_ = latest_->version;
  ComposeLocked(*latest_);
  return Next::kWrite;
}

// Starts what is due. gRPC operations start on the loop thread only: from another thread a Write
// could land after the server's Stop drained and destroyed the queue. So another thread wakes the
// loop, and the loop starts it.
void SnapshotStreamsBase::Call::Pump() {
  CompletionLoop* loop = streams_->loop_;
  if (loop->OnLoopThread()) {
    Next next;
    {
      absl::MutexLock lock(&mu_);
      next = NextLocked();
    }
    Start(next);
    return;
  }
  // Set under mu_: the call's end (OnCallDone, on the loop) must see either no wake or one that
  // will run. Were the wake marked pending before it was set, a Stop in between could drain the
  // loop with this stream kept for a wake that never comes.
  absl::MutexLock lock(&mu_);
  if (wake_pending_ || call_done_) return;  // the wake already set will see the new state
  // Fails only while the queue shuts down: the call's done event then follows on the loop.
  wake_pending_ = loop->Post(&wake_, &woken_);
}

void SnapshotStreamsBase::Call::Start(Next next) {
  if (next == Next::kNothing) return;
  DCHECK(streams_->loop_->OnLoopThread());
  const bool started = streams_->loop_->StartOperation([&] {
    if (next == Next::kWrite) StartWrite(&written_);
    if (next == Next::kFinish) StartFinish(&finished_call_);
  });
  if (!started) {
    // The queue is shutting down: the server cancels the call and its done event follows.
    absl::MutexLock lock(&mu_);
    writing_ = false;
    finishing_ = false;
    finished_ = true;
  }
}

void SnapshotStreamsBase::Call::OnArrived(bool ok) {
  if (!ok) {  // the server is shutting down; no call came, and no done event will
    delete this;
    return;
  }
  streams_->Arm();  // the next client (or a second stream) may call at any time
  SnapshotStreamsBase* owner = streams_->route_ != nullptr ? streams_->route_(context_) : streams_;
  if (owner == nullptr) {
    LOG(WARNING) << streams_->name_ << ": a call from " << context_.peer()
                 << ", a connection no one serves, ends at once";
    streams_->Adopt(this, /*serve=*/false);
    return;
  }
  if (owner != streams_) {
    DCHECK(owner->loop_ == streams_->loop_);
    streams_ = owner;
    Rebound();
  }
  owner->Adopt(this, /*serve=*/true);
}

void SnapshotStreamsBase::Call::OnWoken(bool) {
  Next next;
  {
    absl::MutexLock lock(&mu_);
    wake_pending_ = false;
    next = NextLocked();
  }
  Start(next);
  MaybeForget();
}

void SnapshotStreamsBase::Call::OnWriteDone(bool ok) {
  Next next = Next::kNothing;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (ok) {
      if (streams_->hooks_.written) streams_->hooks_.written();
      next = NextLocked();
    } else {
      // The stream is broken (the client went away): the done event follows.
      finished_ = true;
      end_pending_ = false;
    }
  }
  Start(next);
  MaybeForget();
}

void SnapshotStreamsBase::Call::OnFinishDone(bool) {
  {
    absl::MutexLock lock(&mu_);
    finishing_ = false;
  }
  MaybeForget();
}

// The call is over: finished by us, or cancelled by the client (or by the server's shutdown).
void SnapshotStreamsBase::Call::OnCallDone(bool) {
  const bool cancelled = context_.IsCancelled();
  {
    absl::MutexLock lock(&mu_);
    call_done_ = true;
    finished_ = true;
    end_pending_ = false;
  }
  if (streams_->hooks_.ended) streams_->hooks_.ended(cancelled);
  MaybeForget();
}

// Once the call is over and no write, finish or wake of ours is in flight, nothing will reach
// this object through the queue again.
void SnapshotStreamsBase::Call::MaybeForget() {
  {
    absl::MutexLock lock(&mu_);
    if (!call_done_ || writing_ || finishing_ || wake_pending_ || forgotten_) return;
    forgotten_ = true;
  }
  {
    absl::MutexLock lock(&gate_->mu);  // waits for a Deliver on another thread to return
    gate_->call = nullptr;
  }
  if (subscribed_) streams_->set_->Unsubscribe(listener_id_);
  streams_->Forget(this);  // may destroy this object: nothing may follow
}

// ---------------------------------------------------------------------------------------------
// Every call of the method

SnapshotStreamsBase::SnapshotStreamsBase(DeviceSet* set, std::string name, Hooks hooks)
    : set_(set), name_(std::move(name)), hooks_(std::move(hooks)) {}

SnapshotStreamsBase::~SnapshotStreamsBase() {
  absl::MutexLock lock(&mu_);
  LOG_IF(DFATAL, !calls_.empty()) << name_ << ": destroyed with open streams";
}

void SnapshotStreamsBase::ServeOn(CompletionLoop* loop, RouteFn route) {
  loop_ = loop;
  route_ = std::move(route);
  Arm();
}

void SnapshotStreamsBase::Arm() {
  Call* call = NewCall();
  if (!loop_->StartOperation([call] { call->Wait(); })) delete call;
}

void SnapshotStreamsBase::Adopt(Call* raw, bool serve) {
  std::shared_ptr<Call> call(raw);
  bool ended;
  {
    // Every call is kept alive by this map until it is over (Forget).
    absl::MutexLock lock(&mu_);
    ended = ended_ || !serve;
    calls_[raw] = call;
  }
  if (hooks_.opened) hooks_.opened(!ended);
  if (ended) {
    call->End();  // shutting down: answer at once, with no message
  } else {
    call->Begin();
  }
}

void SnapshotStreamsBase::Forget(Call* call) {
  std::shared_ptr<Call> last;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(call);
  if (it == calls_.end()) return;
  last = std::move(it->second);
  calls_.erase(it);
}

void SnapshotStreamsBase::EndStreams() {
  std::vector<std::shared_ptr<Call>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    for (const auto& [ptr, call] : calls_) open.push_back(call);
  }
  for (const auto& call : open) call->End();
}

void SnapshotStreamsBase::Recheck() {
  std::vector<std::shared_ptr<Call>> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, call] : calls_) open.push_back(call);
  }
  for (const auto& call : open) call->Recheck();
}

bool SnapshotStreamsBase::WaitForStreamsAtMost(int most, absl::Time deadline) const {
  struct Bound {
    const decltype(calls_)* calls;
    int most;
  } bound{&calls_, most};
  const bool done = mu_.LockWhenWithDeadline(
      absl::Condition(+[](Bound* b) { return static_cast<int>(b->calls->size()) <= b->most; },
                      &bound),
      deadline);
  mu_.Unlock();
  return done;
}

int SnapshotStreamsBase::OpenStreams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

}  // namespace edgeaccel
