#include "edgeaccel/dra/dra_grpc_server.h"

#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel {

// One driver's listening sockets, as a member of the accept loop.
class DraGrpcServer::Acceptor final : public PollLoop::Member {
 public:
  Acceptor(DraGrpcServer* server, DraPluginServer* owner, std::vector<int> listening)
      : server_(server), owner_(owner), listening_(std::move(listening)) {}

  DraPluginServer* owner() const { return owner_; }

  PollLoop::Fds WaitFds() override {
    PollLoop::Fds fds;
    fds.fill(-1);
    if (backing_off_) return fds;  // the sockets stay readable: only the wake time counts
    for (size_t i = 0; i < listening_.size() && i < fds.size(); ++i) fds[i] = listening_[i];
    return fds;
  }

  absl::Time Step(const PollLoop::Events& ready) override {
    const bool retry = backing_off_;  // the wake time came: look at every socket
    backing_off_ = false;
    for (size_t i = 0; i < listening_.size() && i < ready.size(); ++i) {
      if (ready[i] == 0 && !retry) continue;
      // Every connection waiting: the socket is level-triggered, but one poll for each is waste.
      while (true) {
        const int fd = accept4(listening_[i], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          server_->Adopt(fd, owner_);
          continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // EMFILE, ENFILE, ENOBUFS: the connection waits in the backlog; looked at again in a
          // second rather than at once, which would spin while the limit holds.
          LOG(WARNING) << "cannot accept a DRA connection (" << strerror(errno)
                       << "): it waits, and is accepted again in a second";
          backing_off_ = true;
          return absl::Now() + absl::Seconds(1);
        }
        break;
      }
    }
    return absl::InfiniteFuture();
  }

 private:
  DraGrpcServer* const server_;
  DraPluginServer* const owner_;
  const std::vector<int> listening_;
  bool backing_off_ = false;  // accept() failed: waiting for the wake time, not the sockets
};

DraGrpcServer::DraGrpcServer(PollLoop* accept_loop) : accept_loop_(accept_loop) {
  if (accept_loop_ == nullptr) {
    own_accept_loop_ = std::make_unique<PollLoop>("ea-dra-accept");
    accept_loop_ = own_accept_loop_.get();
  }
}

DraGrpcServer::~DraGrpcServer() { Stop(absl::ZeroDuration()); }

absl::Status DraGrpcServer::Start() {
  if (started_.has_value()) return *started_;
  v1_ = std::make_unique<drav1::DRAPlugin::AsyncService>();
  v1beta1_ = std::make_unique<drav1beta1::DRAPlugin::AsyncService>();
  health_ = std::make_unique<drahealth::DRAResourceHealth::AsyncService>();
  registration_ = std::make_unique<pluginregistration::Registration::AsyncService>();
  grpc::ServerBuilder builder;  // no listening port: every connection is handed to it
  builder.RegisterService(v1_.get());
  builder.RegisterService(v1beta1_.get());
  builder.RegisterService(health_.get());
  builder.RegisterService(registration_.get());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    started_ = absl::UnavailableError("cannot start the DRA drivers' gRPC server");
    return *started_;
  }
  loop_ = std::make_unique<CompletionLoop>(std::move(cq), "ea-dra");
  loop_->Start();
  started_ = absl::OkStatus();
  return *started_;
}

void DraGrpcServer::Accept(DraPluginServer* owner, std::vector<int> listening) {
  auto acceptor = std::make_unique<Acceptor>(this, owner, std::move(listening));
  Acceptor* added = acceptor.get();
  {
    absl::MutexLock lock(&acceptors_mu_);
    acceptors_.push_back(std::move(acceptor));
  }
  accept_loop_->Add(added);
}

void DraGrpcServer::StopAccepting(DraPluginServer* owner) {
  std::vector<std::unique_ptr<Acceptor>> removed;
  {
    absl::MutexLock lock(&acceptors_mu_);
    for (auto it = acceptors_.begin(); it != acceptors_.end();) {
      if ((*it)->owner() == owner) {
        removed.push_back(std::move(*it));
        it = acceptors_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& acceptor : removed) accept_loop_->Remove(acceptor.get());
}

void DraGrpcServer::Adopt(int fd, DraPluginServer* owner) {
  {
    absl::MutexLock lock(&owners_mu_);
    owners_[fd] = owner;
  }
  // The server owns the descriptor from here, and closes it with the connection.
  grpc::AddInsecureChannelFromFd(server_.get(), fd);
}

DraPluginServer* DraGrpcServer::OwnerOf(const grpc::ServerContext& context) const {
  // "fd:<N>": the name grpc_server_add_insecure_channel_from_fd gives the connection.
  const std::string peer = context.peer();
  absl::string_view number = peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&number, "fd:") || !absl::SimpleAtoi(number, &fd)) return nullptr;
  absl::MutexLock lock(&owners_mu_);
  auto it = owners_.find(fd);
  return it == owners_.end() ? nullptr : it->second;
}

grpc::Status DraGrpcServer::NoOwner(const grpc::ServerContext& context) {
  LOG(WARNING) << "a DRA call from " << context.peer() << ", a connection no driver serves";
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no DRA driver serves this connection");
}

void DraGrpcServer::Stop(absl::Duration grace, const std::function<void()>& drained) {
  {
    absl::MutexLock lock(&acceptors_mu_);
    LOG_IF(DFATAL, !acceptors_.empty()) << "the DRA gRPC server stops while a driver accepts";
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
    loop_->Drain();
    if (drained) drained();
    server_->Wait();
    loop_.reset();
    server_.reset();
  }
  v1_.reset();
  v1beta1_.reset();
  health_.reset();
  registration_.reset();
  started_.reset();
  absl::MutexLock lock(&owners_mu_);
  owners_.clear();
}

}  // namespace edgeaccel
