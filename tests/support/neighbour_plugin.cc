#include "neighbour_plugin.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"

namespace edgeaccel::testing {

bool NeighbourPlugin::Channel::Send(std::vector<v1beta1::Device> item, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  // One sender at a time: wait for the slot to be free.
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !slot_.has_value(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&free), deadline) || closed_) return false;
  slot_ = std::move(item);
  const uint64_t mine = ++sent_;
  auto taken = [this, mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || taken_ >= mine;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&taken), deadline) || taken_ < mine) {
    if (taken_ < mine) {  // nobody took it: withdraw it, as a select with a timeout would
      slot_.reset();
      --sent_;
    }
    return false;
  }
  return true;
}

std::optional<std::vector<v1beta1::Device>> NeighbourPlugin::Channel::Receive() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || slot_.has_value(); };
  mu_.Await(absl::Condition(&ready));
  if (closed_) return std::nullopt;
  std::vector<v1beta1::Device> item = std::move(*slot_);
  slot_.reset();
  ++taken_;
  return item;
}

void NeighbourPlugin::Channel::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

class NeighbourPlugin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(NeighbourPlugin* plugin) : plugin_(plugin) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext*, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    auto send = [&](const std::vector<v1beta1::Device>& devices) {
      v1beta1::ListAndWatchResponse response;
      for (const v1beta1::Device& device : devices) *response.add_devices() = device;
      return writer->Write(response);
    };
    if (plugin_->kind_ == NeighbourKind::kNvidiaLike) {
      if (!send(plugin_->List())) return grpc::Status::OK;
      // for { select { case <-plugin.stop: return nil; case d := <-plugin.health: ... } }
      while (std::optional<std::vector<v1beta1::Device>> event = plugin_->channel_.Receive()) {
        if (!send(plugin_->List())) {
          plugin_->failed_sends_.fetch_add(1);
          return grpc::Status::OK;  // the event is lost with this stream
        }
      }
      return grpc::Status::OK;
    }
    // for srv.devices = range srv.updatesCh { if err := srv.sendDevices(stream); err != nil {...} }
    while (std::optional<std::vector<v1beta1::Device>> devices = plugin_->channel_.Receive()) {
      if (!send(*devices)) {
        plugin_->failed_sends_.fetch_add(1);
        plugin_->StopServerFromHandler();
        return grpc::Status(grpc::StatusCode::UNKNOWN, "unable to send devices");
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    for (int i = 0; i < request->container_requests_size(); ++i) response->add_container_responses();
    return grpc::Status::OK;
  }

 private:
  NeighbourPlugin* const plugin_;
};

NeighbourPlugin::NeighbourPlugin(NeighbourKind kind, const std::string& device_plugin_dir,
                                 const std::string& socket_name, const std::string& resource,
                                 const std::vector<std::string>& ids)
    : kind_(kind),
      directory_(device_plugin_dir),
      socket_name_(socket_name),
      socket_(absl::StrCat(device_plugin_dir, "/", socket_name)),
      resource_(resource) {
  for (const std::string& id : ids) {
    v1beta1::Device device;
    device.set_id(id);
    device.set_health("Healthy");
    devices_.push_back(device);
  }
}

NeighbourPlugin::~NeighbourPlugin() { Stop(); }

std::vector<v1beta1::Device> NeighbourPlugin::List() {
  absl::MutexLock lock(&mu_);
  return devices_;
}

bool NeighbourPlugin::serving() {
  absl::MutexLock lock(&mu_);
  return serving_;
}

absl::Status NeighbourPlugin::Start() {
  unlink(socket_.c_str());
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot serve on ", socket_));
  {
    absl::MutexLock lock(&mu_);
    serving_ = true;
  }
  if (kind_ == NeighbourKind::kIntelLike) {
    // The manager's first Update: onto the shared channel, taken by the first stream.
    first_list_ = std::thread([this] { channel_.Send(List(), absl::Seconds(30)); });
  }
  auto stub = v1beta1::Registration::NewStub(
      DialUnixSocket(absl::StrCat(directory_, "/", kKubeletSocketName)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::RegisterRequest request;
  request.set_version(std::string(kDevicePluginApiVersion));
  request.set_endpoint(socket_name_);
  request.set_resource_name(resource_);
  v1beta1::Empty empty;
  grpc::Status registered = stub->Register(&context, request, &empty);
  if (!registered.ok()) return absl::UnavailableError(registered.error_message());
  return absl::OkStatus();
}

void NeighbourPlugin::StopServerFromHandler() {
  // Go's grpcServer.Stop() from inside a handler; gRPC C++ must not shut down from one.
  absl::MutexLock lock(&mu_);
  if (!serving_) return;
  serving_ = false;
  if (!stopper_.joinable()) {
    stopper_ = std::thread([this] {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    });
  }
}

void NeighbourPlugin::Stop() {
  channel_.Close();
  if (first_list_.joinable()) first_list_.join();
  {
    absl::MutexLock lock(&mu_);
    serving_ = false;
  }
  if (stopper_.joinable()) stopper_.join();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_->Wait();
    server_.reset();
    unlink(socket_.c_str());
  }
}

bool NeighbourPlugin::MarkUnhealthy(const std::string& id, absl::Duration timeout) {
  std::vector<v1beta1::Device> list;
  {
    absl::MutexLock lock(&mu_);
    for (v1beta1::Device& device : devices_) {
      if (device.id() == id) device.set_health("Unhealthy");
    }
    list = devices_;
  }
  return channel_.Send(std::move(list), timeout);
}

}  // namespace edgeaccel::testing
