// HttpEndpoint over real TCP sockets, with raw clients that misbehave the ways real ones do.
#include "edgeaccel/daemon/http_endpoint.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "eventually.h"
#include "fixture_host.h"
#include "serving_thread.h"

namespace edgeaccel {
namespace {

using ::testing::HasSubstr;
using ::edgeaccel::testing::ServingThread;

std::map<std::string, HttpEndpoint::Handler> Handlers() {
  return {{"/healthz", [] { return HttpAnswer{200, "text/plain", "ok\n"}; }},
          {"/metrics", [] { return HttpAnswer{200, "text/plain", std::string(300000, '#')}; }},
          {"/sick", [] { return HttpAnswer{503, "text/plain", "not registered\n"}; }}};
}

// A raw TCP connection to the endpoint.
int Dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<struct sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

std::string Exchange(int port, const std::string& request) {
  int fd = Dial(port);
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buffer[65536];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(HttpEndpointTest, AnswersGetAndHeadAndRefusesTheRest) {
  HttpEndpoint endpoint("127.0.0.1", 0, Handlers());
  ASSERT_TRUE(endpoint.Listen().ok());
  ServingThread serving(endpoint, "test-http");
  httplib::Client client("127.0.0.1", endpoint.port());
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");
  auto metrics = client.Get("/metrics?name[]=x");  // Prometheus may add parameters
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.size(), 300000u);  // larger than one socket buffer
  EXPECT_EQ(client.Get("/sick")->status, 503);
  EXPECT_EQ(client.Get("/nope")->status, 404);
  EXPECT_EQ(client.Post("/healthz", "x", "text/plain")->status, 405);
  std::string head = Exchange(endpoint.port(), "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(head, HasSubstr("Content-Length: 3\r\n"));
  EXPECT_THAT(head, ::testing::EndsWith("\r\n\r\n"));
  EXPECT_THAT(Exchange(endpoint.port(), "garbage\r\n\r\n"), HasSubstr("400 Bad Request"));
  EXPECT_THAT(Exchange(endpoint.port(), "GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n"),
              HasSubstr("431"));
}

TEST(HttpEndpointTest, APortInUseIsAClearError) {
  HttpEndpoint first("127.0.0.1", 0, Handlers());
  ASSERT_TRUE(first.Listen().ok());
  ServingThread serving(first, "test-http");
  HttpEndpoint second("127.0.0.1", first.port(), Handlers());
  absl::Status status = second.Listen();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("Address already in use"));
  HttpEndpoint unresolvable("no-such-host.invalid", 0, Handlers());
  EXPECT_FALSE(unresolvable.Listen().ok());
}

// The kubelet's liveness probe gives /healthz one second. Twenty clients that connect and say
// nothing, plus eight threads scraping /metrics as fast as they can, must not make it wait.
TEST(HttpEndpointTest, HealthzIsAnsweredWhileMetricsIsScrapedHard) {
  HttpEndpoint endpoint("127.0.0.1", 0, Handlers(), absl::Seconds(5));
  ASSERT_TRUE(endpoint.Listen().ok());
  ServingThread serving(endpoint, "test-http");
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(Dial(endpoint.port()));
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0};
  std::atomic<int> scraping{0};  // scrapers that have had an answer
  std::vector<std::thread> scrapers;
  for (int i = 0; i < 8; ++i) {
    scrapers.emplace_back([&] {
      httplib::Client client("127.0.0.1", endpoint.port());
      client.set_keep_alive(true);
      bool answered = false;
      while (!stop.load()) {
        if (!client.Get("/metrics")) continue;
        scrapes++;
        if (!answered) scraping++;
        answered = true;
      }
    });
  }
  // The probes below go in while every scraper keeps a connection busy.
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return scraping.load() == 8; }));
  httplib::Client probe("127.0.0.1", endpoint.port());
  probe.set_connection_timeout(1, 0);
  probe.set_read_timeout(1, 0);
  absl::Duration slowest;
  for (int i = 0; i < 20; ++i) {
    const absl::Time start = absl::Now();
    auto health = probe.Get("/healthz");
    ASSERT_TRUE(health) << "probe " << i << " got no answer within 1 s";
    EXPECT_EQ(health->status, 200);
    slowest = std::max(slowest, absl::Now() - start);
  }
  EXPECT_LT(slowest, absl::Milliseconds(500));
  stop.store(true);
  for (std::thread& t : scrapers) t.join();
  for (int fd : silent) close(fd);
  EXPECT_GT(scrapes.load(), 20);
}

TEST(HttpEndpointTest, SilentClientsAreDroppedAfterTheTimeout) {
  HttpEndpoint endpoint("127.0.0.1", 0, Handlers(), absl::Milliseconds(200));
  ASSERT_TRUE(endpoint.Listen().ok());
  ServingThread serving(endpoint, "test-http");
  int fd = Dial(endpoint.port());
  (void)!send(fd, "GET /hea", 8, MSG_NOSIGNAL);  // half a request, then nothing
  const absl::Time start = absl::Now();
  char buffer[16];
  EXPECT_EQ(recv(fd, buffer, sizeof(buffer), 0), 0);  // closed by the server
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  close(fd);
}

// CPU time, in clock ticks, of this process's thread named `name`.
long ThreadTicks(const std::string& name) {
  long total = 0;
  for (const std::string& task : {std::string("/proc/self/task")}) {
    DIR* dir = opendir(task.c_str());
    if (dir == nullptr) return -1;
    while (struct dirent* entry = readdir(dir)) {
      const std::string base = task + "/" + entry->d_name;
      std::ifstream comm(base + "/comm");
      std::string thread_name;
      if (!std::getline(comm, thread_name) || thread_name != name) continue;
      std::ifstream stat(base + "/stat");
      std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      std::vector<std::string> fields = absl::StrSplit(text.substr(text.rfind(')') + 2), ' ');
      total += std::stol(fields[11]) + std::stol(fields[12]);  // utime + stime
    }
    closedir(dir);
  }
  return total;
}

// Out of fds, a listening socket stays readable forever: accepting must pause, not spin, and
// the waiting client is answered once there is room again.
TEST(HttpEndpointTest, OutOfFdsPausesAcceptingInsteadOfSpinning) {
  HttpEndpoint endpoint("127.0.0.1", 0, Handlers());
  ASSERT_TRUE(endpoint.Listen().ok());
  ServingThread serving(endpoint, "test-http-fds");
  ::edgeaccel::testing::AllFdsTaken fds;
  fds.Give(1);  // for the client's own socket
  int client = Dial(endpoint.port());
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!send(client, request.data(), request.size(), MSG_NOSIGNAL);
  const long before = ThreadTicks("test-http-fds");
  absl::SleepFor(absl::Milliseconds(500));
  const long spent = ThreadTicks("test-http-fds") - before;
  fds.Restore();
  EXPECT_LT(spent, 10) << "clock ticks in 0.5 s: the accept loop spun";
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(client, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, static_cast<size_t>(n));
  close(client);
  EXPECT_THAT(out, HasSubstr("200 OK"));
}

}  // namespace
}  // namespace edgeaccel
