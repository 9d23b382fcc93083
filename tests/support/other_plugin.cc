#include "other_plugin.h"

#include "absl/strings/str_cat.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"

namespace edgeaccel::testing {
namespace {

std::vector<Device> Devices(const std::vector<std::string>& ids) {
  std::vector<Device> devices;
  for (const std::string& id : ids) {
    Device device;
    device.id = id;
    devices.push_back(device);
  }
  return devices;
}

}  // namespace

OtherPlugin::OtherPlugin(const std::string& device_plugin_dir, const std::string& socket_name,
                         const std::string& resource, const std::vector<std::string>& ids)
    : directory_(device_plugin_dir),
      socket_name_(socket_name),
      socket_(absl::StrCat(device_plugin_dir, "/", socket_name)),
      set_(resource),
      server_(socket_, &set_, &counters_, nullptr) {
  set_.Update(Devices(ids));
}

absl::Status OtherPlugin::Start() {
  absl::Status status = server_.Start();
  if (!status.ok()) return status;
  auto stub = v1beta1::Registration::NewStub(
      DialUnixSocket(absl::StrCat(directory_, "/", kKubeletSocketName)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::RegisterRequest request;
  request.set_version(std::string(kDevicePluginApiVersion));
  request.set_endpoint(socket_name_);
  request.set_resource_name(set_.resource_name());
  v1beta1::Empty empty;
  grpc::Status registered = stub->Register(&context, request, &empty);
  if (!registered.ok()) return absl::UnavailableError(registered.error_message());
  return absl::OkStatus();
}

}  // namespace edgeaccel::testing
