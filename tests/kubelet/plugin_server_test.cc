// PluginServer owns one Unix socket: it serves there, replaces a stale socket, refuses a path
// that another process serves on or that is not a socket, and never deletes what is not its own.
#include "edgeaccel/kubelet/plugin_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::PathExists;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

// The names in `dir`, sorted ("." and ".." left out).
std::vector<std::string> ReadDirectoryNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* listing = opendir(dir.c_str())) {
    while (struct dirent* entry = readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(listing);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// One socket path in a directory of its own, and what a server on it needs.
class PluginServerSocketTest : public ::testing::Test {
 protected:
  std::unique_ptr<PluginServer> NewServer() {
    return std::make_unique<PluginServer>(path_, &set_, &counters_, nullptr);
  }

  TempDir dir_;
  const std::string path_ = dir_.path() + "/plugin.sock";
  DeviceSet set_{"coral.ai/edgetpu"};
  PluginCounters counters_;
};

TEST_F(PluginServerSocketTest, SocketIsOwnerOnlyAndItsDisappearanceIsSeen) {
  auto server = NewServer();
  ASSERT_TRUE(server->Start().ok());
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_TRUE(server->SocketPresent());
  unlink(path_.c_str());
  EXPECT_FALSE(server->SocketPresent());
}

TEST_F(PluginServerSocketTest, PathTakenByAFileIsAClearError) {
  FILE* f = fopen(path_.c_str(), "w");
  fclose(f);
  auto server = NewServer();
  absl::Status status = server->Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("taken by a regular file"));
  struct stat st;
  EXPECT_EQ(stat(path_.c_str(), &st), 0) << "a file we do not own must not be deleted";

  unlink(path_.c_str());
  mkdir(path_.c_str(), 0755);
  EXPECT_THAT(std::string(server->Start().message()), HasSubstr("taken by a directory"));
}

TEST_F(PluginServerSocketTest, StaleSocketIsReplacedLiveOneIsNot) {
  {
    // A live server holds the path.
    auto first = NewServer();
    ASSERT_TRUE(first->Start().ok());
    auto second = NewServer();
    EXPECT_EQ(second->Start().code(), absl::StatusCode::kAlreadyExists);
  }
  // A socket file nobody serves on (a crashed earlier run).
  ::edgeaccel::testing::MakeStaleSocket(path_);
  auto third = NewServer();
  EXPECT_TRUE(third->Start().ok());
}

// A rollout with maxSurge: the moment the old daemon's socket stops answering, the new one
// replaces it as stale and serves there. The old one's shutdown must leave that socket alone:
// gRPC unlinks the path it listened on when it shuts down, whoever's socket is there by then.
TEST_F(PluginServerSocketTest, TheSocketOfTheNextServerOnItsPathOutlivesItsStop) {
  auto old = NewServer();
  ASSERT_TRUE(old->Start().ok());
  ASSERT_EQ(unlink(path_.c_str()), 0);  // as the next daemon does to a socket that stopped answering
  auto next = NewServer();
  ASSERT_TRUE(next->Start().ok());
  old->Stop();
  EXPECT_TRUE(next->SocketPresent()) << "the old server's shutdown removed the next one's socket";
  EXPECT_TRUE(UnixSocketAnswers(path_));
  next->Stop();
  EXPECT_FALSE(PathExists(path_));
  // Nothing of either is left beside it.
  EXPECT_EQ(ReadDirectoryNames(dir_.path()), std::vector<std::string>{});
}

// The socket the kubelet dials is the one gRPC listens on (a hard link to it); gRPC's own name
// for it starts with a dot, which the kubelet's plugin watcher and edgeaccel's neighbour look skip.
TEST_F(PluginServerSocketTest, ItsSocketIsALinkToAPrivateDotNameAndBothGoWithIt) {
  auto server = NewServer();
  ASSERT_TRUE(server->Start().ok());
  std::vector<std::string> names = ReadDirectoryNames(dir_.path());
  ASSERT_EQ(names.size(), 2u) << absl::StrJoin(names, " ");
  EXPECT_EQ(names[1], "plugin.sock");
  EXPECT_TRUE(absl::StartsWith(names[0], ".plugin.sock.")) << names[0];
  struct stat linked, listening;
  ASSERT_EQ(stat(path_.c_str(), &linked), 0);
  ASSERT_EQ(stat((dir_.path() + "/" + names[0]).c_str(), &listening), 0);
  EXPECT_EQ(linked.st_ino, listening.st_ino);
  EXPECT_EQ(listening.st_mode & 0777, 0600);
  server->Stop();
  EXPECT_EQ(ReadDirectoryNames(dir_.path()), std::vector<std::string>{});
}

// A private socket left by a process that died is removed at the next start.
TEST_F(PluginServerSocketTest, APrivateSocketLeftByADeadProcessIsRemovedAtStart) {
  const std::string stale = dir_.path() + "/.plugin.sock.99999.0";
  ::edgeaccel::testing::MakeStaleSocket(stale);
  auto server = NewServer();
  ASSERT_TRUE(server->Start().ok());
  EXPECT_FALSE(PathExists(stale));
  server->Stop();
}

}  // namespace
}  // namespace edgeaccel

namespace edgeaccel {
namespace {

// Stopping while the kubelet keeps calling (unary calls and new ListAndWatch streams on fresh
// connections): every call gets an answer or an error, every call object is freed (the service's
// destructor checks that no stream is left; ASan's leak check in CI). Whether a re-armed wait
// lands after the queue's shutdown is a matter of timing here: completion_loop_test checks the
// guard against that deterministically.
TEST(PluginServerTest, StoppingWhileCallsKeepArrivingIsClean) {
  TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  DeviceSet set("coral.ai/edgetpu");
  Device device;
  device.id = "0000:03:00.0";
  device.nodes.push_back({"/dev/apex_0", "/dev/apex_0", "rw"});
  set.Update({device});
  PluginCounters counters;
  for (int round = 0; round < 15; ++round) {
    PluginServer server(path, &set, &counters, nullptr);
    ASSERT_TRUE(server.Start().ok());
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 3; ++c) {
      clients.emplace_back([&, c] {
        while (!stop.load()) {
          grpc::ChannelArguments args;
          args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection each time
          auto stub = v1beta1::DevicePlugin::NewStub(
              grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args));
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
          if (c == 0) {
            auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
            v1beta1::ListAndWatchResponse response;
            reader->Read(&response);
            context.TryCancel();
            reader->Finish();
          } else {
            v1beta1::AllocateRequest request;
            request.add_container_requests()->add_devices_ids("0000:03:00.0");
            v1beta1::AllocateResponse response;
            stub->Allocate(&context, request, &response);
          }
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(20 + 7 * round));
    server.Stop();
    stop.store(true);
    for (auto& client : clients) client.join();
  }
  EXPECT_GT(counters.allocations.load(), 0u);
}

}  // namespace
}  // namespace edgeaccel

namespace edgeaccel {
namespace {

// Device lists change on discovery's threads while the server stops. Every gRPC operation of a
// stream starts on the loop thread (checked in Debug builds: the sanitizer runs), so a late
// Write cannot land on a queue that Stop already drained and destroyed.
TEST(PluginServerTest, DeviceChangesOnOtherThreadsWhileStoppingAreSafe) {
  TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  for (int round = 0; round < 10; ++round) {
    PluginServer server(path, &set, &counters, nullptr);
    ASSERT_TRUE(server.Start().ok());
    auto stub = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
    v1beta1::ListAndWatchResponse response;
    ASSERT_TRUE(reader->Read(&response));
    std::atomic<bool> stop{false};
    std::atomic<int> changes{0};
    std::vector<std::thread> discovery;
    for (int t = 0; t < 2; ++t) {
      discovery.emplace_back([&, t] {
        for (int i = 0; !stop.load(); ++i) {
          Device device;
          device.id = "apex_" + std::to_string(t);
          device.health = i % 2 ? Health::kHealthy : Health::kUnhealthy;
          device.nodes.push_back({"/dev/apex_0", "/dev/apex_0", "rw"});
          set.Update({device});
          changes.fetch_add(1);
        }
      });
    }
    // Stop once the client has seen changes go out.
    for (int seen = 0; seen < 3 + round;) seen += reader->Read(&response) ? 1 : 100;
    server.Stop();
    stop.store(true);
    for (auto& t : discovery) t.join();
    while (reader->Read(&response)) {
    }
    reader->Finish();  // ended by the server or cancelled at its shutdown: both are answers
    EXPECT_GT(changes.load(), 0);
  }
}

}  // namespace
}  // namespace edgeaccel
