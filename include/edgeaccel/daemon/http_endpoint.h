// HttpEndpoint: the tiny HTTP/1.1 server behind /metrics and /healthz.
//
// One thread (the caller's: Serve), non-blocking sockets in one epoll set, which a PollLoop on
// that thread waits on: no worker pool a slow or kept-alive client could hold, so the kubelet's
// liveness probe is answered however hard /metrics is scraped. Each connection carries one GET
// (or HEAD) and is closed after the answer (Connection: close, as Prometheus and the kubelet's
// prober accept); a client that has not sent a whole request within `request_timeout`, or that
// sends more than 8 KiB of headers, is dropped. While no connection is open the thread sleeps
// with no deadline: nothing wakes it.
#ifndef EDGEACCEL_DAEMON_HTTP_ENDPOINT_H_
#define EDGEACCEL_DAEMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/poll_loop.h"

namespace edgeaccel {

struct HttpAnswer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpEndpoint : private PollLoop::Member {
 public:
  using Handler = std::function<HttpAnswer()>;

  // `host` is an address or name to bind ("0.0.0.0", "127.0.0.1", "::"); port 0 picks one.
  HttpEndpoint(std::string host, int port, std::map<std::string, Handler> handlers,
               absl::Duration request_timeout = absl::Seconds(1));
  ~HttpEndpoint() override;  // Stop()
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Binds and listens (a taken port is its error), and makes every other descriptor Serve()
  // needs: a Serve() that comes later, when the process may be out of descriptors, makes none.
  absl::Status Listen();
  // Answers on the calling thread (the daemon's main thread: the endpoint has no thread of its
  // own) until Stop() is called from another thread or `until_fd` (a descriptor of the caller's:
  // a signalfd, an eventfd) becomes readable; leaves `until_fd` unread. False when it could not
  // serve (not listening, or stopped).
  bool Serve(int until_fd = -1);
  // Ends a Serve() running on another thread and waits for it to return, then closes the port.
  // Idempotent; after it, Serve() returns false at once.
  void Stop();
  int port() const { return port_; }

 private:
  struct Connection;

  // PollLoop::Member, on the serving thread: what the epoll set says, then the deadlines.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  void Accept();
  void Receive(Connection* c);
  // A whole request head has arrived: route it.
  void Route(Connection* c);
  void Answer(Connection* c, const HttpAnswer& answer, bool head);
  // Sends what is left of the answer; true when the connection is done with.
  bool Flush(Connection* c);
  void Drop(int fd);
  // The listening socket back in the epoll set after a pause for want of descriptors.
  void ResumeAccept();
  void Watch(int fd, uint32_t events, int op);

  const std::string host_;
  const int requested_port_;
  const std::map<std::string, Handler> handlers_;
  const absl::Duration request_timeout_;
  int listen_fd_ = -1;  // set by Listen(), closed by Stop() once no Serve() runs
  int epoll_fd_ = -1;   // the same
  int port_ = 0;
  // The serving thread's alone (between Serve()'s start and its return).
  std::unordered_map<int, std::unique_ptr<Connection>> connections_;
  // Out of fds: the listening socket leaves the epoll set until then (on the monotonic clock).
  absl::Duration accept_paused_until_ = absl::InfiniteDuration();
  absl::Mutex mu_;
  PollLoop* serving_on_ ABSL_GUARDED_BY(mu_) = nullptr;  // Serve()'s, while it runs
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DAEMON_HTTP_ENDPOINT_H_
