// The Unix-socket helpers the registrar and the servers share: waiting for a socket that exists
// but does not listen yet (the kubelet's, between its bind and its listen), and telling a live
// socket from a stale one. Real sockets in a temporary directory.
#include "edgeaccel/kubelet/unix_socket_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

// A socket bound at `path` that does not listen yet: connect() is refused until Listen().
class BoundSocket {
 public:
  explicit BoundSocket(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = bind(fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~BoundSocket() { close(fd_); }
  bool bound() const { return bound_; }
  bool Listen() { return listen(fd_, 4) == 0; }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

TEST(UnixSocketChannelTest, WaitsForASocketBetweenBindAndListen) {
  ::edgeaccel::testing::TempDir dir;
  const std::string path = dir.path() + "/kubelet.sock";
  BoundSocket kubelet(path);
  ASSERT_TRUE(kubelet.bound());
  EXPECT_FALSE(UnixSocketAnswers(path)) << "bound, not listening: refused";
  std::thread listener([&kubelet] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(kubelet.Listen());
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitUntilUnixSocketAccepts(path, absl::Seconds(10)));
  const auto waited = std::chrono::steady_clock::now() - start;
  listener.join();
  EXPECT_GE(waited, std::chrono::milliseconds(25)) << "it waited for the listen";
  EXPECT_LT(waited, std::chrono::seconds(5)) << "and went on once it came";
  EXPECT_TRUE(UnixSocketAnswers(path));
}

TEST(UnixSocketChannelTest, WaitingEndsAtItsBudgetOrAtOnceWhenThereIsNoSocket) {
  ::edgeaccel::testing::TempDir dir;
  const std::string path = dir.path() + "/kubelet.sock";
  BoundSocket never_listens(path);
  ASSERT_TRUE(never_listens.bound());
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(WaitUntilUnixSocketAccepts(path, absl::Milliseconds(20)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));

  // No file at all: the kubelet is not there; nothing to wait for.
  start = std::chrono::steady_clock::now();
  EXPECT_FALSE(WaitUntilUnixSocketAccepts(dir.path() + "/absent.sock", absl::Seconds(10)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace edgeaccel
