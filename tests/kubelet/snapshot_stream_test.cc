// SnapshotStreams over a real Unix socket: a server-streaming method (here the device plugin's
// ListAndWatch, with messages of the test's own making) served on a CompletionLoop.
#include "edgeaccel/kubelet/snapshot_stream.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::TempDir;
using Streams = SnapshotStreams<v1beta1::Empty, v1beta1::ListAndWatchResponse>;

// `count` devices; DeviceSet::Update makes a new version only when the list differs.
std::vector<Device> Devices(int count) {
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) {
    Device device;
    device.id = absl::StrCat("dev_", i);
    device.health = Health::kHealthy;
    devices.push_back(device);
  }
  return devices;
}

class SnapshotStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_.Update(Devices(2));
    Streams::Messages messages;
    // One entry per device, and `extra_` more; every entry carries the snapshot's version.
    messages.build = [this](const Snapshot& snapshot, v1beta1::ListAndWatchResponse* out) {
      NoteHookThread();
      builds_.fetch_add(1);
      for (const Device& device : snapshot.devices) {
        v1beta1::Device* entry = out->add_devices();
        entry->set_id(device.id);
        entry->set_health(absl::StrCat(snapshot.version));
      }
      for (int i = 0; i < extra_.load(); ++i) {
        v1beta1::Device* entry = out->add_devices();
        entry->set_id(absl::StrCat("extra_", i));
        entry->set_health(absl::StrCat(snapshot.version));
      }
    };
    messages.resend = [this](const Snapshot& latest, const v1beta1::ListAndWatchResponse& sent) {
      NoteHookThread();
      return static_cast<size_t>(sent.devices_size()) != latest.devices.size() + extra_.load();
    };
    Streams::Hooks hooks;
    hooks.paused = [this] {
      NoteHookThread();
      return paused_.load();
    };
    hooks.written = [this] {
      NoteHookThread();
      written_.fetch_add(1);
    };
    hooks.opened = [this](bool serving) {
      NoteHookThread();
      absl::MutexLock lock(&mu_);
      opened_.push_back(serving);
    };
    hooks.ended = [this](bool cancelled) {
      NoteHookThread();
      absl::MutexLock lock(&mu_);
      ended_.push_back(cancelled);
    };
    streams_ = std::make_unique<Streams>(&set_, "test stream", std::move(messages), std::move(hooks));

    service_ = std::make_unique<v1beta1::DevicePlugin::AsyncService>();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    loop_ = std::make_unique<CompletionLoop>(std::move(cq), "test-loop");
    grpc::ServerCompletionQueue* raw_cq = loop_->cq();
    v1beta1::DevicePlugin::AsyncService* service = service_.get();
    streams_->Serve(loop_.get(), [service, raw_cq](auto* context, auto* request, auto* writer, void* tag) {
      service->RequestListAndWatch(context, request, writer, raw_cq, raw_cq, tag);
    });
    loop_->Start();
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  }

  void TearDown() override {
    Stop();
    streams_.reset();  // DFATAL had a stream outlived the server
    EXPECT_FALSE(off_loop_hook_.load()) << "a hook ran off the loop thread";
  }

  // As a server stops: end the streams, shut down, drain the loop.
  void Stop() {
    if (server_ == nullptr) return;
    streams_->EndStreams();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    loop_->Drain();
    server_->Wait();
    EXPECT_EQ(streams_->OpenStreams(), 0);
    loop_.reset();
    server_.reset();
  }

  void NoteHookThread() {
    if (!loop_->OnLoopThread()) off_loop_hook_.store(true);
  }

  struct Client {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader;
  };
  std::unique_ptr<Client> Open() {
    auto client = std::make_unique<Client>();
    client->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    client->reader = stub_->ListAndWatch(&client->context, v1beta1::Empty());
    return client;
  }
  // The next message's device count and version; version 0 when the stream ended.
  static std::pair<int, uint64_t> Next(Client* client) {
    v1beta1::ListAndWatchResponse response;
    if (!client->reader->Read(&response)) return {0, 0};
    EXPECT_GT(response.devices_size(), 0);
    if (response.devices_size() == 0) return {0, 0};
    return {response.devices_size(), std::stoull(response.devices(0).health())};
  }

  std::vector<bool> Opened() {
    absl::MutexLock lock(&mu_);
    return opened_;
  }
  std::vector<bool> Ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  TempDir dir_;
  std::string socket_ = dir_.path() + "/stream.sock";
  DeviceSet set_{"example.com/dev"};
  std::atomic<bool> paused_{false};
  std::atomic<int> extra_{0};
  std::atomic<int> builds_{0};
  std::atomic<int> written_{0};
  std::atomic<bool> off_loop_hook_{false};
  absl::Mutex mu_;
  std::vector<bool> opened_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> ended_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Streams> streams_;
  std::unique_ptr<v1beta1::DevicePlugin::AsyncService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionLoop> loop_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(SnapshotStreamTest, SendsTheCurrentStateAtOnceAndEveryChangeAfter) {
  auto client = Open();
  const uint64_t first = set_.Current()->version;
  EXPECT_EQ(Next(client.get()), std::make_pair(2, first));
  EXPECT_EQ(Opened(), std::vector<bool>{true});
  EXPECT_EQ(streams_->OpenStreams(), 1);

  // From another thread than the loop's, as a HostWatcher updates the set.
  std::thread([&] { set_.Update(Devices(3)); }).join();
  EXPECT_EQ(Next(client.get()), std::make_pair(3, first + 1));
  set_.Update(Devices(1));
  EXPECT_EQ(Next(client.get()), std::make_pair(1, first + 2));
  EXPECT_TRUE(Eventually([&] { return written_.load() == 3; }));
  client->context.TryCancel();
}

TEST_F(SnapshotStreamTest, ChangesThatCannotGoOutYetGoOutAsOneMessageOfTheNewest) {
  auto client = Open();
  ASSERT_EQ(Next(client.get()).first, 2);
  paused_.store(true);
  for (int i = 1; i <= 20; ++i) set_.Update(Devices(i % 5 + 1));
  const uint64_t newest = set_.Current()->version;
  streams_->Recheck();  // still paused: nothing goes out
  paused_.store(false);
  streams_->Recheck();
  EXPECT_EQ(Next(client.get()), std::make_pair(20 % 5 + 1, newest));
  // Nothing in between: the next message is the next version.
  set_.Update(Devices(4));
  EXPECT_EQ(Next(client.get()), std::make_pair(4, newest + 1));
  EXPECT_EQ(builds_.load(), 3);
  EXPECT_EQ(streams_->OpenStreams(), 1);
  client->context.TryCancel();
}

TEST_F(SnapshotStreamTest, SendsTheSameVersionAgainOnlyWhenResendSaysSo) {
  auto client = Open();
  const uint64_t version = set_.Current()->version;
  ASSERT_EQ(Next(client.get()), std::make_pair(2, version));
  streams_->Recheck();  // resend says no: nothing goes out
  extra_.store(1);
  streams_->Recheck();
  EXPECT_EQ(Next(client.get()), std::make_pair(3, version));
  streams_->Recheck();  // what was sent is current again
  set_.Update(Devices(4));
  EXPECT_EQ(Next(client.get()), std::make_pair(5, version + 1));
  EXPECT_EQ(builds_.load(), 3);
  client->context.TryCancel();
}

TEST_F(SnapshotStreamTest, EveryStreamHasItsOwnState) {
  // A stream nobody reads must not hold back one that is read.
  auto abandoned = Open();
  auto live = Open();
  ASSERT_EQ(Next(abandoned.get()).first, 2);
  ASSERT_EQ(Next(live.get()).first, 2);
  for (int i = 1; i <= 10; ++i) {
    set_.Update(Devices(i % 3 + 3));  // another list each time: a new version
    EXPECT_EQ(Next(live.get()), std::make_pair(i % 3 + 3, set_.Current()->version));
  }
  EXPECT_EQ(streams_->OpenStreams(), 2);
  abandoned->context.TryCancel();
  live->context.TryCancel();
}

TEST_F(SnapshotStreamTest, EndStreamsFinishesWithOkAndEndsLaterCallsAtOnce) {
  auto client = Open();
  ASSERT_EQ(Next(client.get()).first, 2);
  streams_->EndStreams();
  EXPECT_EQ(Next(client.get()).second, 0u);
  EXPECT_TRUE(client->reader->Finish().ok());

  auto late = Open();
  EXPECT_EQ(Next(late.get()).second, 0u);  // no message
  EXPECT_TRUE(late->reader->Finish().ok());
  EXPECT_TRUE(Eventually([&] { return streams_->OpenStreams() == 0; }));
  EXPECT_EQ(Opened(), (std::vector<bool>{true, false}));
  EXPECT_EQ(Ended(), (std::vector<bool>{false, false}));  // ended by us, not cancelled
}

TEST_F(SnapshotStreamTest, AClientThatGoesIsForgotten) {
  auto client = Open();
  ASSERT_EQ(Next(client.get()).first, 2);
  client->context.TryCancel();
  EXPECT_TRUE(Eventually([&] { return streams_->OpenStreams() == 0; }));
  EXPECT_EQ(Ended(), std::vector<bool>{true});
  // Its listener is gone: a change reaches no stream.
  set_.Update(Devices(3));
  auto next = Open();
  EXPECT_EQ(Next(next.get()).first, 3);
  EXPECT_EQ(streams_->OpenStreams(), 1);
  next->context.TryCancel();
}

TEST_F(SnapshotStreamTest, TheServerStopsWhileChangesArrive) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(Open());
    ASSERT_EQ(Next(clients.back().get()).first, 2);
  }
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    for (int i = 0; !stop.load(); ++i) set_.Update(Devices(i % 4 + 1));
  });
  absl::SleepFor(absl::Milliseconds(50));
  Stop();  // every stream is over and forgotten, with writes and wakes in flight
  stop.store(true);
  updater.join();
  for (auto& client : clients) {
    while (Next(client.get()).second != 0) {
    }
  }
  EXPECT_EQ(Ended().size(), 4u);
}

}  // namespace
}  // namespace edgeaccel
