#include "edgeaccel/daemon/http_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr size_t kMaxRequestBytes = 8 * 1024;
// How long a client may take to read its answer.
constexpr absl::Duration kWriteTimeout = absl::Seconds(10);
// How long accepting pauses when this process is out of fds.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

// Deadlines on the monotonic clock: a wall-clock step must not drop or keep connections.
absl::Duration Monotonic() {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return absl::DurationFromTimespec(now);
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string Response(const HttpAnswer& answer, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", answer.status, " ", Reason(answer.status),
                                 "\r\nContent-Type: ", answer.content_type,
                                 "\r\nContent-Length: ", answer.body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (!head) out += answer.body;
  return out;
}

}  // namespace

struct HttpEndpoint::Connection {
  int fd = -1;
  std::string in;
  std::string out;
  size_t written = 0;
  absl::Duration deadline;  // on Monotonic()
  ~Connection() {
    if (fd >= 0) close(fd);
  }
};

HttpEndpoint::HttpEndpoint(std::string host, int port, std::map<std::string, Handler> handlers,
                           absl::Duration request_timeout)
    : host_(std::move(host)),
      requested_port_(port),
      handlers_(std::move(handlers)),
      request_timeout_(request_timeout) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

absl::Status HttpEndpoint::Listen() {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* found = nullptr;
  const std::string port = std::to_string(requested_port_);
  if (int err = getaddrinfo(host_.c_str(), port.c_str(), &hints, &found); err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", host_, "\": ", gai_strerror(err)));
  }
  std::unique_ptr<struct addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  int last_error = 0;
  for (struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = errno;
      continue;
    }
    // SO_REUSEADDR for quick restarts; never SO_REUSEPORT, which would let a second daemon
    // bind the same port and silently take half the scrapes.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = errno;
    close(fd);
  }
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host_, ":", requested_port_,
                                               ": ", strerror(last_error)));
  }
  struct sockaddr_storage bound = {};
  socklen_t length = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<struct sockaddr*>(&bound), &length);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    const int err = errno;
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::InternalError(absl::StrCat("cannot listen on ", host_, ":", requested_port_,
                                            ": epoll: ", strerror(err)));
  }
  return absl::OkStatus();
}

void HttpEndpoint::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  if (serving_on_ != nullptr) {
    serving_on_->Remove(this);  // its last member: Serve()'s loop returns
    mu_.Await(absl::Condition(
        +[](PollLoop** serving_on) { return *serving_on == nullptr; }, &serving_on_));
  }
  for (int* fd : {&listen_fd_, &epoll_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

bool HttpEndpoint::Serve(int until_fd) {
  PollLoop loop(PollLoop::CallersThread{}, "the /metrics server");
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || listen_fd_ < 0) return false;
    Watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
    // Under mu_: a Stop() from now on finds the member to remove.
    serving_on_ = &loop;
    loop.Add(this);
  }
  loop.RunOnCallersThread(until_fd);
  loop.Remove(this);  // where until_fd ended it
  // As Listen() left it, for a Serve() that may come later.
  connections_.clear();  // closing them takes them out of the epoll set
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accept_paused_until_ = absl::InfiniteDuration();
  absl::MutexLock lock(&mu_);
  serving_on_ = nullptr;
  return true;
}

void HttpEndpoint::Watch(int fd, uint32_t events, int op) {
  struct epoll_event ev = {};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, op, fd, &ev);
}

PollLoop::Fds HttpEndpoint::WaitFds() { return {epoll_fd_, -1, -1, -1}; }

absl::Time HttpEndpoint::Step(const PollLoop::Events&) {
  struct epoll_event events[32];
  const int n = epoll_wait(epoll_fd_, events, 32, 0);
  if (n < 0 && errno != EINTR) LOG(ERROR) << "/metrics server: epoll_wait: " << strerror(errno);
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == listen_fd_) {
      Accept();
    } else if (auto it = connections_.find(fd); it != connections_.end()) {
      Connection* c = it->second.get();
      if (c->out.empty()) {
        Receive(c);
      } else if (Flush(c)) {
        Drop(fd);
      }
    }
  }
  // Deadlines are judged on the monotonic clock: a wall-clock step drops or keeps no connection
  // (it can only move the loop's next wake-up, after which they are judged again).
  const absl::Duration now = Monotonic();
  if (accept_paused_until_ <= now) ResumeAccept();
  std::vector<int> late;
  for (const auto& [fd, c] : connections_) {
    if (c->deadline <= now) late.push_back(fd);
  }
  for (int fd : late) Drop(fd);  // silent or stalled: the slot is not theirs to hold
  absl::Duration earliest = accept_paused_until_;
  for (const auto& [fd, c] : connections_) earliest = std::min(earliest, c->deadline);
  if (earliest == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + (earliest - now);
}

void HttpEndpoint::Accept() {
  while (true) {
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The backlog keeps the waiting clients until there is room again. The listening socket
        // stays readable, so it leaves the epoll set meanwhile (else this thread would spin).
        LOG_EVERY_N(WARNING, 100) << "/metrics server: cannot accept: " << strerror(errno);
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_until_ = Monotonic() + kAcceptPause;
      }
      return;  // EAGAIN: all accepted
    }
    auto c = std::make_unique<Connection>();
    c->fd = client;
    c->deadline = Monotonic() + request_timeout_;
    Watch(client, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    connections_[client] = std::move(c);
  }
}

void HttpEndpoint::Receive(Connection* c) {
  char buffer[4096];
  bool closed = false;
  while (true) {
    ssize_t got = recv(c->fd, buffer, sizeof(buffer), 0);
    if (got > 0) {
      c->in.append(buffer, static_cast<size_t>(got));
      if (c->in.size() > kMaxRequestBytes) break;
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    closed = got == 0 || errno != EAGAIN;
    break;
  }
  if (c->in.find("\r\n\r\n") != std::string::npos) {
    Route(c);
  } else if (c->in.size() > kMaxRequestBytes) {
    Answer(c, {431, "text/plain; charset=utf-8", "request too large\n"}, false);
  } else if (closed) {
    Drop(c->fd);
  }
}

void HttpEndpoint::Route(Connection* c) {
  absl::string_view request_line = c->in;
  request_line = request_line.substr(0, request_line.find("\r\n"));
  std::vector<absl::string_view> parts = absl::StrSplit(request_line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    Answer(c, {400, "text/plain; charset=utf-8", "malformed request\n"}, false);
    return;
  }
  const bool head = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head) {
    Answer(c, {405, "text/plain; charset=utf-8", "only GET and HEAD\n"}, false);
    return;
  }
  absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  auto handler = handlers_.find(std::string(path));
  if (handler == handlers_.end()) {
    Answer(c, {404, "text/plain; charset=utf-8", "not found\n"}, head);
    return;
  }
  Answer(c, handler->second(), head);
}

void HttpEndpoint::Answer(Connection* c, const HttpAnswer& answer, bool head) {
  c->out = Response(answer, head);
  c->deadline = Monotonic() + kWriteTimeout;  // the request is in: now the client reads
  Watch(c->fd, EPOLLOUT, EPOLL_CTL_MOD);
  if (Flush(c)) Drop(c->fd);
}

bool HttpEndpoint::Flush(Connection* c) {
  while (c->written < c->out.size()) {
    ssize_t n = send(c->fd, c->out.data() + c->written, c->out.size() - c->written, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno != EAGAIN;  // a broken connection is done with too
    }
    c->written += static_cast<size_t>(n);
  }
  return true;
}

void HttpEndpoint::Drop(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  connections_.erase(fd);  // closes it
  if (accept_paused_until_ != absl::InfiniteDuration()) ResumeAccept();  // a descriptor is free again
}

void HttpEndpoint::ResumeAccept() {
  accept_paused_until_ = absl::InfiniteDuration();
  Watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
}

}  // namespace edgeaccel
