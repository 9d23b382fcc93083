#include "edgeaccel/daemon/http_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
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

// Deadlines on the clock the timerfd runs on: a wall-clock step must not drop or keep
// connections.
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

struct Connection {
  int fd = -1;
  std::string in;
  std::string out;
  size_t written = 0;
  absl::Duration deadline;  // on Monotonic()
  ~Connection() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

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
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = stop_fd_ < 0 ? -1 : epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = epoll_fd_ < 0 ? -1 : timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) {
    const int err = errno;
    for (int* fd : {&listen_fd_, &stop_fd_, &epoll_fd_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    return absl::InternalError(absl::StrCat("cannot listen on ", host_, ":", requested_port_,
                                            ": eventfd, epoll or timerfd: ", strerror(err)));
  }
  return absl::OkStatus();
}

void HttpEndpoint::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  if (serving_) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    mu_.Await(absl::Condition(
        +[](bool* serving) { return !*serving; }, &serving_));
  }
  for (int* fd : {&listen_fd_, &stop_fd_, &epoll_fd_, &timer_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

bool HttpEndpoint::Serve(int until_fd) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || listen_fd_ < 0) return false;
    serving_ = true;
  }
  const bool served = ServeUntilStopped(until_fd);
  absl::MutexLock lock(&mu_);
  serving_ = false;
  return served;
}

bool HttpEndpoint::ServeUntilStopped(int until_fd) {
  // Made by Listen(): nothing here needs a new descriptor but the clients'.
  const int epoll_fd = epoll_fd_;
  const int timer_fd = timer_fd_;
  auto add = [epoll_fd](int fd, uint32_t events) {
    struct epoll_event ev = {};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  };
  add(listen_fd_, EPOLLIN);
  add(stop_fd_, EPOLLIN);
  if (until_fd >= 0) add(until_fd, EPOLLIN);
  add(timer_fd, EPOLLIN);
  std::unordered_map<int, std::unique_ptr<Connection>> connections;
  absl::Duration armed = absl::InfiniteDuration();
  // Out of fds: the listening socket stays readable, so it leaves the epoll set until a
  // connection closes or the pause is over (else this thread would spin).
  absl::Duration accept_paused_until = absl::InfiniteDuration();
  auto resume_accept = [&] {
    if (accept_paused_until == absl::InfiniteDuration()) return;
    accept_paused_until = absl::InfiniteDuration();
    add(listen_fd_, EPOLLIN);
  };

  // Arms the timer for the earliest deadline, or disarms it when nothing is due.
  auto rearm = [&] {
    absl::Duration earliest = accept_paused_until;
    for (const auto& [fd, c] : connections) earliest = std::min(earliest, c->deadline);
    if (earliest == armed) return;
    armed = earliest;
    struct itimerspec spec = {};
    if (earliest != absl::InfiniteDuration()) {
      absl::Duration in = std::max(earliest - Monotonic(), absl::Microseconds(1));
      spec.it_value = absl::ToTimespec(in);
    }
    timerfd_settime(timer_fd, 0, &spec, nullptr);
  };
  auto drop = [&](int fd) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    connections.erase(fd);  // closes it
    resume_accept();
  };
  // Sends what is left of the answer; true when the connection is done with.
  auto flush = [&](Connection* c) {
    while (c->written < c->out.size()) {
      ssize_t n = send(c->fd, c->out.data() + c->written, c->out.size() - c->written, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno != EAGAIN;  // a broken connection is done with too
      }
      c->written += static_cast<size_t>(n);
    }
    return true;
  };
  auto answer = [&](Connection* c, const HttpAnswer& a, bool head) {
    c->out = Response(a, head);
    c->deadline = Monotonic() + kWriteTimeout;  // the request is in: now the client reads
    struct epoll_event ev = {};
    ev.events = EPOLLOUT;
    ev.data.fd = c->fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
    if (flush(c)) drop(c->fd);
  };
  // A whole request head has arrived: route it.
  auto serve = [&](Connection* c) {
    absl::string_view request_line = c->in;
    request_line = request_line.substr(0, request_line.find("\r\n"));
    std::vector<absl::string_view> parts = absl::StrSplit(request_line, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
      answer(c, {400, "text/plain; charset=utf-8", "malformed request\n"}, false);
      return;
    }
    const bool head = parts[0] == "HEAD";
    if (parts[0] != "GET" && !head) {
      answer(c, {405, "text/plain; charset=utf-8", "only GET and HEAD\n"}, false);
      return;
    }
    absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    auto handler = handlers_.find(std::string(path));
    if (handler == handlers_.end()) {
      answer(c, {404, "text/plain; charset=utf-8", "not found\n"}, head);
      return;
    }
    answer(c, handler->second(), head);
  };

  struct epoll_event events[32];
  bool served = true;
  while (true) {
    int n = epoll_wait(epoll_fd, events, 32, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "the /metrics server stopped: epoll_wait: " << strerror(errno);
      served = false;
      break;
    }
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_fd_ || fd == until_fd) {
        stop = true;
      } else if (fd == listen_fd_) {
        while (true) {
          int client = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (client < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
              // The backlog keeps the waiting clients until there is room again.
              LOG_EVERY_N(WARNING, 100) << "/metrics server: cannot accept: " << strerror(errno);
              epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd_, nullptr);
              accept_paused_until = Monotonic() + kAcceptPause;
            }
            break;  // EAGAIN: all accepted
          }
          auto c = std::make_unique<Connection>();
          c->fd = client;
          c->deadline = Monotonic() + request_timeout_;
          add(client, EPOLLIN | EPOLLRDHUP);
          connections[client] = std::move(c);
        }
      } else if (fd == timer_fd) {
        uint64_t expirations;
        (void)!read(timer_fd, &expirations, sizeof(expirations));
        armed = absl::InfiniteDuration();
        const absl::Duration now = Monotonic();
        if (accept_paused_until <= now) resume_accept();
        std::vector<int> late;
        for (const auto& [cfd, c] : connections) {
          if (c->deadline <= now) late.push_back(cfd);
        }
        for (int cfd : late) drop(cfd);  // silent or stalled: the slot is not theirs to hold
      } else if (auto it = connections.find(fd); it != connections.end()) {
        Connection* c = it->second.get();
        if (!c->out.empty()) {
          if (flush(c)) drop(fd);
          continue;
        }
        char buffer[4096];
        bool closed = false;
        while (true) {
          ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
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
          serve(c);
        } else if (c->in.size() > kMaxRequestBytes) {
          answer(c, {431, "text/plain; charset=utf-8", "request too large\n"}, false);
        } else if (closed) {
          drop(fd);
        }
      }
    }
    if (stop) break;
    rearm();
  }
  connections.clear();  // closing them takes them out of the epoll set
  // As Listen() left them, for a Serve() that may come later.
  for (int fd : {listen_fd_, stop_fd_, until_fd, timer_fd}) {
    if (fd >= 0) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  }
  const struct itimerspec disarmed = {};
  timerfd_settime(timer_fd, 0, &disarmed, nullptr);
  return served;
}

}  // namespace edgeaccel
