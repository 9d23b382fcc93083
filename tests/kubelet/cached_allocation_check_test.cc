// The pre-start check against the answer the kubelet cached: what a restarted container finds.
#include "edgeaccel/kubelet/cached_allocation_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/escaping.h"
#include "edgeaccel/inventory/device_set.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

Device Usb(const std::string& port, const std::string& node) {
  Device d;
  d.id = port;
  d.nodes = {{node, node, "rw"}};
  return d;
}

class CachedAllocationCheckTest : public ::testing::Test {
 protected:
  // The kubelet admitted a pod with `id` and cached an answer giving `node`.
  void Admitted(const std::string& id, const std::string& node) {
    v1beta1::ContainerAllocateResponse answer;
    auto* spec = answer.add_devices();
    spec->set_host_path(node);
    spec->set_container_path(node);
    std::ofstream(checkpoint_)
        << R"({"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c",)"
        << R"("ResourceName":"coral.ai/edgetpu","DeviceIDs":{"-1":[")" << id
        << R"("]},"AllocResp":")" << absl::Base64Escape(answer.SerializeAsString())
        << R"("}],"RegisteredDevices":{}},"Checksum":0})";
  }
  absl::Status Check(std::vector<Device> now, const std::vector<std::string>& ids) {
    set_.Update(std::move(now));
    return check_(*set_.Current(), ids);
  }

  TempDir dir_;
  const std::string checkpoint_ = dir_.path() + "/kubelet_internal_checkpoint";
  DeviceSet set_{"coral.ai/edgetpu"};
  PreStartHook check_ = CachedAllocationCheck(checkpoint_, "coral.ai/edgetpu");
};

TEST_F(CachedAllocationCheckTest, UnchangedDevicesStart) {
  Admitted("2-1", "/dev/bus/usb/002/003");
  EXPECT_TRUE(Check({Usb("2-1", "/dev/bus/usb/002/003")}, {"2-1"}).ok());
}

TEST_F(CachedAllocationCheckTest, AReenumeratedAcceleratorIsRefusedNamingOldAndNewNodes) {
  Admitted("2-1", "/dev/bus/usb/002/003");
  absl::Status status = Check({Usb("2-1", "/dev/bus/usb/002/004")}, {"2-1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("the answer the kubelet cached for 2-1 gives /dev/bus/usb/002/003"));
  EXPECT_THAT(message, HasSubstr("it has /dev/bus/usb/002/004 now"));
  EXPECT_THAT(message, HasSubstr("delete the pod"));
}

TEST_F(CachedAllocationCheckTest, AnUnpluggedDeviceIsRefused) {
  Admitted("2-1", "/dev/bus/usb/002/003");
  absl::Status status = Check({Usb("2-2", "/dev/bus/usb/002/009")}, {"2-1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("device 2-1 is gone"));
}

TEST_F(CachedAllocationCheckTest, AnUnhealthyDeviceWaitsForTheKubeletsRetry) {
  Admitted("2-1", "/dev/bus/usb/002/003");
  Device hot = Usb("2-1", "/dev/bus/usb/002/003");
  hot.health = Health::kUnhealthy;
  hot.unhealthy_reason = "firmware not loaded";
  absl::Status status = Check({hot}, {"2-1"});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("device 2-1 is Unhealthy: firmware not loaded"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("once the device is Healthy again"));
}

TEST_F(CachedAllocationCheckTest, NoCheckpointOrAnUnknownContainerNeverBlocksAStart) {
  // No checkpoint file at all (an unusual kubelet): only what the snapshot says counts.
  EXPECT_TRUE(Check({Usb("2-1", "/dev/bus/usb/002/004")}, {"2-1"}).ok());
  std::ofstream(checkpoint_) << "garbage";
  EXPECT_TRUE(Check({Usb("2-1", "/dev/bus/usb/002/004")}, {"2-1"}).ok());
  Admitted("2-2", "/dev/bus/usb/002/009");  // another container
  EXPECT_TRUE(Check({Usb("2-1", "/dev/bus/usb/002/004")}, {"2-1"}).ok());
}

}  // namespace
}  // namespace edgeaccel
